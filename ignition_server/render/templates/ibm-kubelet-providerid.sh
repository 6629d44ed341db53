#!/usr/bin/env bash
# Rendered by ignition-server (IBM Cloud VPC Gen 2).
# Runs at boot, before the kubelet: asks the VPC instance metadata service for this node's
# facts and writes the kubelet's provider ID (ibm://<account>///<cluster>/<worker>) to an
# environment file the kubelet drop-in reads. Per-node facts never travel in the payload.
set -euo pipefail

IBM_CLOUD_ENV=${IBM_CLOUD_ENV:-/etc/ibm/ibm-cloud.env}
# shellcheck disable=SC1090
. "$IBM_CLOUD_ENV"
OUT=${IBM_KUBELET_ENV:-/run/ibm/kubelet.env}
MD=${IBM_METADATA_ENDPOINT:-http://169.254.169.254}
API_VERSION=${IBM_METADATA_API_VERSION:-2022-03-01}
ATTEMPTS=${IBM_METADATA_ATTEMPTS:-60}

# curl with retries on every failure (connection refused while the network comes up, 5xx).
fetch() {
  local i out
  for ((i = 1; i <= ATTEMPTS; i++)); do
    if out=$(curl --silent --show-error --fail --max-time 10 "$@"); then
      printf '%s' "$out"
      return 0
    fi
    echo "metadata request failed (attempt $i/$ATTEMPTS), retrying" >&2
    sleep "${IBM_METADATA_RETRY_DELAY:-2}"
  done
  return 1
}

token=$(fetch -X PUT "$MD/identity/v1/token?version=$API_VERSION" \
  -H "Metadata-Flavor: ibm" -H "Content-Type: application/json" \
  -d '{"expires_in": 300}' | jq -er .access_token)

instance=$(fetch "$MD/metadata/v1/instance?version=$API_VERSION" -H "Authorization: Bearer $token")

worker_id=$(jq -er --arg f "${IBM_WORKER_ID_FIELD:-name}" '.[$f]' <<<"$instance")
instance_id=$(jq -er .id <<<"$instance")
zone=$(jq -r '.zone.name // empty' <<<"$instance")
private_ip=$(jq -r '.primary_network_interface.primary_ip.address // .primary_network_interface.primary_ipv4_address // empty' <<<"$instance")

valid='^[A-Za-z0-9._-]+$'
for v in "$worker_id" "$instance_id"; do
  if [[ ! $v =~ $valid ]]; then
    echo "unexpected value from the instance metadata service: '$v'" >&2
    exit 1
  fi
done
if [[ -n $zone && ! $zone =~ $valid ]]; then
  echo "unexpected zone from the instance metadata service: '$zone'" >&2
  exit 1
fi
if [[ -n $private_ip && ! $private_ip =~ ^[0-9a-fA-F:.]+$ ]]; then
  echo "unexpected private IP from the instance metadata service: '$private_ip'" >&2
  exit 1
fi

mkdir -p "$(dirname "$OUT")"
tmp=$(mktemp "$(dirname "$OUT")/.kubelet.env.XXXXXX")
cat >"$tmp" <<ENV
KUBELET_PROVIDERID=ibm://${IBM_ACCOUNT_ID}///${IBM_CLUSTER_ID}/${worker_id}
IBM_WORKER_ID=${worker_id}
IBM_INSTANCE_ID=${instance_id}
IBM_ZONE=${zone}
IBM_PRIVATE_IP=${private_ip}
ENV
chmod 0644 "$tmp"
mv -f "$tmp" "$OUT"
echo "kubelet provider ID: ibm://${IBM_ACCOUNT_ID}///${IBM_CLUSTER_ID}/${worker_id}"
