# strand/recoverer:dev — built by `make images` from a context holding only the
# static binaries (bin/images/ctx-recoverer/). Nothing is pulled: FROM scratch.
FROM scratch
LABEL dev.strand.image=recoverer
COPY strand-recoverer strand-healthprobe /
# Stateless: everything it knows is in etcd. scratch has no directories;
# WORKDIR creates /tmp, where Go's os.TempDir points.
WORKDIR /tmp
EXPOSE 7103
ENTRYPOINT ["/strand-recoverer"]
