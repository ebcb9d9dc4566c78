# One image with every volplane binary: docker build -t volplane .
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o /out/ \
      ./services/watcher/cmd/watcher ./services/binder/cmd/binder \
      ./services/provisioner/cmd/provisioner ./services/reclaimer/cmd/reclaimer \
      ./gateway/cmd/gateway ./cmd/volplane-csi

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/ /usr/local/bin/
USER nonroot
