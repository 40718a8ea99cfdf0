# strand/etcd:dev — built by `make images` from a context holding only the
# static binaries (bin/images/ctx-etcd/). Nothing is pulled: FROM scratch.
FROM scratch
LABEL dev.strand.image=etcd
COPY etcd strand-healthprobe /
# scratch has no directories; WORKDIR creates them (owned by root, which the
# process runs as). /tmp is where Go's os.TempDir points.
WORKDIR /tmp
WORKDIR /data
VOLUME /data
EXPOSE 2379
ENTRYPOINT ["/etcd"]
# A single member serving clients on every interface. Compose and the e2e
# suite pass their own flags; these make a bare `docker run` useful.
CMD ["--name=etcd", "--data-dir=/data/etcd", \
     "--listen-client-urls=http://0.0.0.0:2379", "--advertise-client-urls=http://127.0.0.1:2379"]
