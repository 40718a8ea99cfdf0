# strand/broker:dev — built by `make images` from a context holding only the
# static binaries (bin/images/ctx-broker/). Nothing is pulled: FROM scratch.
FROM scratch
LABEL dev.strand.image=broker
COPY strand-broker strand-healthprobe /
# scratch has no directories; WORKDIR creates them (owned by root, which the
# process runs as). /tmp is where Go's os.TempDir points.
WORKDIR /tmp
WORKDIR /data
VOLUME /data
EXPOSE 7110
ENTRYPOINT ["/strand-broker"]
