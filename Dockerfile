# groupkv image: the static groupkv binary on an empty base image.
#
# The binary is built on the host, not in a build stage, so that the image
# needs no base image from a registry (the Docker engines this is built on
# may have no registry access): the build context must hold a "groupkv"
# binary built with CGO_ENABLED=0, which .dockerignore lets through alone.
#
#   CGO_ENABLED=0 GOOS=linux go build -trimpath -o groupkv ./cmd/groupkv
#   docker build -t groupkv .
#   docker run --rm -p 127.0.0.1:7070:7070 -v groupkv-data:/data groupkv
#
# The default command runs a one-node cluster. Arguments replace it; give the
# whole server command line (the entrypoint is the binary), e.g.
#
#   docker run groupkv server --node-id 2 --data-dir /data \
#     --listen 0.0.0.0:7070 --peer-listen 0.0.0.0:7071 \
#     --advertise-addr node2:7070 --join node1:7071
#
# docker-compose.yml runs three such nodes; scripts/docker-cluster-test.sh
# builds the binary and this image and tests that cluster.
FROM scratch
COPY groupkv /groupkv
# Client API (HTTP/JSON and gRPC) and node-to-node traffic.
EXPOSE 7070 7071
VOLUME /data
ENTRYPOINT ["/groupkv"]
CMD ["server", "--data-dir", "/data", "--listen", "0.0.0.0:7070", "--peer-listen", "0.0.0.0:7071"]
