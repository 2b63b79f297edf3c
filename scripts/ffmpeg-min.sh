#!/usr/bin/env bash
# ffmpeg-min.sh DEST — Debian 12's own FFmpeg (5.1, the source package of the installed libavcodec59, with
# Debian's patches) built with only what vigil's video layer uses, into DEST/lib, for the GPU machine's bundle
# (scripts/gpu-check.sh pack). vigil itself links Debian's packaged FFmpeg; this build exists because the GPU
# machines have no FFmpeg and the packaged libraries' closure (x265, codec2, rav1e, librsvg, ...) is too large
# to carry there. Same sonames, same symbol versions (LIBAVCODEC_59, ...), so the binaries built against
# Debian's headers load it unchanged.
#
# What is in it: demuxers mov/mp4, matroska, avi, h264, hevc, mpegts; decoders h264, hevc, mpeg4,
# msmpeg4v3 (vtest.avi), mjpeg, with the NVDEC hwaccels for h264 and hevc (FFmpeg's CUDA hwcontext,
# nv-codec-headers from Debian's libffmpeg-nvenc-dev: the driver's libcuda/libnvcuvid are loaded at run time);
# the libx264 and mpeg4 encoders and the mp4/avi muxers (video::VideoWriter, the tests' clips); libswscale;
# the file and tcp protocols (tcp: live cameras served on loopback for the hot standby's GPU runs, MPEG-TS over
# TCP); nothing autodetected (no VAAPI, VDPAU, X11, zlib). Assembly on (nasm), as in Debian's build, so CPU decoding is as fast as the packaged one.
# Needs: apt deb-src entries for bookworm (added here if missing), dpkg-dev, nasm, libx264-dev,
# libffmpeg-nvenc-dev. Takes ~4 min on 2 cores.
set -euo pipefail
dest="$(realpath -m "${1:?usage: ffmpeg-min.sh DEST}")"
[ -f "$dest/lib/libavcodec.so.59" ] && { echo "ffmpeg-min: $dest already built"; exit 0; }
version="$(dpkg-query -W -f '${Version}' libavcodec59)"
work="${FFMPEG_MIN_WORK:-/tmp/ffmpeg-min}"
mkdir -p "$work" "$dest"
if ! ls "$work"/src/configure >/dev/null 2>&1; then
  cd "$work"
  rm -rf ffmpeg_* src
  if ! apt-get source --download-only -qq "ffmpeg=$version" -o APT::Sandbox::User=root >/dev/null 2>&1; then
    [ -f /etc/apt/sources.list.d/debian.sources ] || {
      echo "ffmpeg-min: no deb-src entries and no /etc/apt/sources.list.d/debian.sources to derive them from;" \
        "add deb-src lines for bookworm and bookworm-security" >&2; exit 1; }
    sed -e 's/^Types: deb$/Types: deb-src/' /etc/apt/sources.list.d/debian.sources \
      >/etc/apt/sources.list.d/vigil-deb-src.sources
    apt-get update -qq
    apt-get source --download-only -qq "ffmpeg=$version" -o APT::Sandbox::User=root >/dev/null
  fi
  apt-get install -y -qq dpkg-dev nasm libx264-dev libffmpeg-nvenc-dev >/dev/null
  dpkg-source -x ffmpeg_*.dsc src >/dev/null
fi
cd "$work/src"
./configure --prefix="$dest" --enable-shared --disable-static --disable-programs --disable-doc \
  --disable-avdevice --disable-avfilter --disable-postproc --disable-swresample \
  --disable-autodetect --disable-everything --enable-gpl --enable-libx264 --enable-ffnvcodec --enable-cuda --enable-nvdec \
  --enable-protocol=file,tcp --enable-demuxer=mov,matroska,avi,h264,hevc,mpegts \
  --enable-decoder=h264,hevc,mpeg4,msmpeg4v3,mjpeg --enable-parser=h264,hevc,mpeg4video,mjpeg \
  --enable-hwaccel=h264_nvdec,hevc_nvdec --enable-bsf=null,h264_mp4toannexb,hevc_mp4toannexb \
  --enable-encoder=libx264,mpeg4 --enable-muxer=mp4,mov,avi >"$work/configure.log"
make -j"$(nproc)" >"$work/make.log" 2>&1 || { tail -n 50 "$work/make.log" >&2; exit 1; }
make install >/dev/null
rm -rf "$dest/include" "$dest/lib/pkgconfig"
ls -la "$dest/lib"
