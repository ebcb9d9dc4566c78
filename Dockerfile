# Every volplane image, FROM scratch: `make images` (hack/build-images.sh)
# stages a context per image (static binaries in usr/local/bin, a passwd
# with the non-root user 65532, the build host's CA certificates, an empty
# /tmp and the data directories under var/lib/volplane) and builds this
# file in it. No registry is needed.
FROM scratch
COPY rootfs/ /
COPY --chown=65532:65532 data/ /var/lib/volplane/
USER 65532:65532
