#!/usr/bin/env bash
# Installs the Debian (and npm) packages sluice's build, tests and demo need, when missing.
# Debian 12: g++ 12, CMake 3.25, Asio 1.22 (standalone), Catch2 2.13, zlib, libcurl,
# pugixml.
#   scripts/deps.sh          what the build and the demo need (with the image layer's
#                            libjpeg-turbo, libspng and OpenCV imgproc, and ISA-L for
#                            TFRecord's checksum)
#   scripts/deps.sh --test   and what the tests need: libtorch-dev (the libtorch trainer
#                            example), python3-dev, pybind11-dev, python3-pip,
#                            python3-setuptools and python3-torch (the Python module, its
#                            pip install and its tests), python3 (its tarfile writes the tar
#                            test archives and runs the fault-injecting HTTP server),
#                            clang and libFuzzer (the fuzz targets), nginx (HTTP tests),
#                            iproute2 (ip and tc: the simulated nodes' namespaces),
#                            Node.js + npm and s3rver (S3 listing tests, installed into
#                            tests/support/s3rver/node_modules from its package-lock.json),
#                            moto_server and boto3 (signed S3 tests; moto is not packaged
#                            by Debian 12: pip installs it when missing, and the tests that
#                            need it report themselves skipped if that fails)
#   scripts/deps.sh --bench  and what bench/run.sh's peers need: python3-torch,
#                            python3-torchvision and python3-boto3 (the image case study's
#                            DataLoader, reading files, URLs or S3 objects), and
#                            nginx's echo module (libnginx-mod-http-echo: objects behind
#                            a 50 ms first byte, served at nginx's cost)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
test_deps=0 bench_deps=0
[ "${1:-}" = "--test" ] && test_deps=1
[ "${1:-}" = "--bench" ] && test_deps=1 bench_deps=1
packages=(g++ make cmake libasio-dev catch2 zlib1g-dev libcurl4-openssl-dev libpugixml-dev libdlpack-dev ccache
          libjpeg62-turbo-dev libspng-dev libopencv-imgproc-dev libisal-dev)
# The tests also check decoded images against PIL's (Debian's python3-pil, with numpy), and
# restart-marker JPEGs made by libjpeg-turbo's cjpeg (libjpeg-turbo-progs).
# libtorch (libtorch-dev, CPU) for the C++ trainer example the tests build and run; the
# Python module's build (python3-dev, pybind11-dev), its pip install (python3-pip,
# python3-setuptools) and its tests (python3-torch: torch.from_dlpack). The exported
# figures are read back by prometheus_client's own parser (python3-prometheus-client).
# The simulated nodes (tests/support/sim_nodes.py) need ip and tc (iproute2).
[ $test_deps = 1 ] && packages+=(python3 clang libclang-rt-dev nginx python3-pil python3-numpy libjpeg-turbo-progs libtorch-dev
                                 python3-dev pybind11-dev python3-pip python3-setuptools python3-torch
                                 python3-prometheus-client iproute2)
# bench/run.sh's peers: PyTorch's DataLoader with torchvision, and boto3 in its workers
# (Debian's, for /usr/bin/python3); nginx's echo_sleep delays the first byte of the remote rows.
[ $bench_deps = 1 ] && packages+=(python3-torch python3-torchvision python3-boto3 libnginx-mod-http-echo)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if [ $test_deps = 1 ]; then
  # Commands, not packages: Node.js may come from NodeSource (with its own npm, which
  # Debian's npm package would conflict with), boto3 from pip.
  command -v node >/dev/null || missing+=(nodejs)
  command -v npm >/dev/null || missing+=(npm)
  python3 -c 'import boto3' 2>/dev/null || missing+=(python3-boto3)
fi
sudo=()
if [ "$(id -u)" -ne 0 ]; then
  sudo=(sudo)
  if [ ${#missing[@]} -gt 0 ] && ! command -v sudo >/dev/null; then
    echo "sluice: run as root or install sudo to install: ${missing[*]}" >&2
    exit 1
  fi
fi
if [ ${#missing[@]} -gt 0 ]; then
  echo "sluice: installing missing Debian packages: ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  "${sudo[@]}" apt-get update -qq
  "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
[ $test_deps = 1 ] || exit 0
if [ ! -x "$here/tests/support/s3rver/node_modules/.bin/s3rver" ]; then
  echo "sluice: installing s3rver (npm ci in tests/support/s3rver)" >&2
  (cd "$here/tests/support/s3rver" && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
fi
if ! command -v moto_server >/dev/null; then
  echo "sluice: installing moto (pip install 'moto[server]')" >&2
  python3 -m pip install --quiet 'moto[server]' >&2 ||
    echo "sluice: moto could not be installed: the signed-S3 tests will report themselves skipped" >&2
fi
exit 0
