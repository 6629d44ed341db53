#!/usr/bin/env bash
# Rendered by ignition-server (IBM Cloud VPC Gen 2).
# Prepares the instance's secondary (instance-storage) disk at boot and mounts it:
#   luks: LUKS2 with a throw-away key kept in /run (instance storage is ephemeral: a
#         reboot loses the key, and the disk is formatted again), ext4 inside;
#   ext4: plain ext4, kept across reboots.
# The disk is the first whole disk with no partitions and no signature, or the one this
# script labelled before. Without such a disk it does nothing.
set -euo pipefail

IBM_CLOUD_ENV=${IBM_CLOUD_ENV:-/etc/ibm/ibm-cloud.env}
# shellcheck disable=SC1090
. "$IBM_CLOUD_ENV"
strategy=${IBM_SECONDARY_STORAGE:-}
mount_point=${IBM_SECONDARY_STORAGE_MOUNT:-/var/data}
label=ibm-secondary
mapper=ibm-secondary

case "$strategy" in
  "") echo "no secondary storage strategy configured"; exit 0 ;;
  luks | ext4) ;;
  *) echo "unknown secondary storage strategy '$strategy'" >&2; exit 1 ;;
esac

if mountpoint -q "$mount_point"; then
  echo "$mount_point is already mounted"
  exit 0
fi

find_disk() {
  local dev
  dev=$(blkid -l -o device -t LABEL="$label" 2>/dev/null || true)
  if [[ -n $dev ]]; then
    echo "$dev"
    return
  fi
  local name type
  while read -r name type; do
    [[ $type == disk ]] || continue
    # whole disks without partitions, holders or any signature
    [[ $(lsblk -nro NAME "/dev/$name" | wc -l) -eq 1 ]] || continue
    blkid -p "/dev/$name" >/dev/null 2>&1 && continue
    echo "/dev/$name"
    return
  done < <(lsblk -dnro NAME,TYPE | sort)
}

disk=$(find_disk)
if [[ -z $disk ]]; then
  echo "no secondary disk found"
  exit 0
fi
echo "secondary disk: $disk ($strategy)"
mkdir -p "$mount_point"

if [[ $strategy == luks ]]; then
  keyfile=/run/ibm/secondary-storage.key
  mkdir -p /run/ibm
  if [[ ! -e /dev/mapper/$mapper ]]; then
    umask 077
    head -c 64 /dev/urandom >"$keyfile"
    cryptsetup luksFormat --type luks2 --batch-mode --label "$label" --key-file "$keyfile" "$disk"
    cryptsetup open --key-file "$keyfile" "$disk" "$mapper"
    mkfs.ext4 -q -L ibm-data "/dev/mapper/$mapper"
  fi
  mount "/dev/mapper/$mapper" "$mount_point"
else
  if [[ $(blkid -o value -s TYPE "$disk" 2>/dev/null || true) != ext4 ]]; then
    mkfs.ext4 -F -q -L "$label" "$disk"
  fi
  mount "$disk" "$mount_point"
fi
restorecon -R "$mount_point" 2>/dev/null || true
