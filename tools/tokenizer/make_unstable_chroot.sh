#!/usr/bin/env bash
# Build a Debian-unstable chroot holding python3 and python3-tokenizers (the Hugging Face
# `tokenizers` library), used to generate expected token ids and the Engram token map goldens.
# Usage: make_unstable_chroot.sh CHROOT_DIR [MIRROR]
# The mirror defaults to the first deb.debian.org-style URI apt uses on this machine.
# On success touches CHROOT_DIR/.ready and writes CHROOT_DIR/.available naming what works.
set -euo pipefail
dir="${1:?usage: make_unstable_chroot.sh CHROOT_DIR [MIRROR]}"
mirror="${2:-}"
if [[ -z "$mirror" ]]; then
  mirror=$(grep -hoE '(URIs:|deb) +https?://[^ ]*/debian/?( |$)' /etc/apt/sources.list /etc/apt/sources.list.d/* 2>/dev/null \
             | head -n1 | awk '{print $2}' || true)
  mirror="${mirror:-http://deb.debian.org/debian}"
fi
echo "chroot: $dir  mirror: $mirror"
command -v debootstrap >/dev/null || apt-get install -y debootstrap
if [[ ! -x "$dir/usr/bin/apt-get" ]]; then
  debootstrap --variant=minbase unstable "$dir" "$mirror"
fi
# Package installs inside the chroot need /proc and a resolver.
cp /etc/resolv.conf "$dir/etc/resolv.conf" 2>/dev/null || true
mountpoint -q "$dir/proc" || mount -t proc proc "$dir/proc" || true
cleanup() { umount "$dir/proc" 2>/dev/null || true; }
trap cleanup EXIT
# The mirror may serve a frozen snapshot whose Release file has passed its Valid-Until date.
echo 'Acquire::Check-Valid-Until "false";' > "$dir/etc/apt/apt.conf.d/99no-check-valid-until"
chroot "$dir" apt-get update
if chroot "$dir" env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
     python3 python3-tokenizers; then
  if chroot "$dir" python3 -c "import tokenizers; print(tokenizers.__version__)" > "$dir/.available.tmp"; then
    echo "python3-tokenizers $(cat "$dir/.available.tmp")" > "$dir/.available"
    rm -f "$dir/.available.tmp"
    touch "$dir/.ready"
    echo "ready: $(cat "$dir/.available")"
    exit 0
  fi
fi
chroot "$dir" env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3 || true
echo "python3-tokenizers unavailable in unstable; use the npm package @huggingface/tokenizers instead" > "$dir/.available"
touch "$dir/.ready"
echo "ready without python3-tokenizers (see $dir/.available)"
