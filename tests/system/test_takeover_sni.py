"""Many taken-over clusters on one server: each cluster's nodes reach it at their own Route
hostname, and the certificate served for that name (chosen by SNI, tls/sni.py) covers it and is
verified by the CA in that cluster's `ignition-server-ca-cert`, as a node's Ignition verifies it.
Checked with `openssl s_client -servername` against the real server processes (the owner alone,
and worker processes)."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest

from ignition_server.takeover import ca_cert
from testsupport.harness import ServerProcess, sni_handshake as handshake, wait_for
from testsupport.hcp_inputs import hcp_world
from testsupport.kubeapi import KubeAPI

CLUSTERS = {"alpha": "ignition.alpha.apps.example.com", "beta": "ignition-beta.hosted.example.net",
            "gamma": "nodes.gamma.example.org"}


def route(hostname: str) -> list[dict[str, Any]]:
    return [{"service": "Ignition", "servicePublishingStrategy": {"type": "Route", "route": {"hostname": hostname}}}]


@pytest.mark.parametrize("workers", ["0", "2"])
def test_each_clusters_route_hostname_gets_a_certificate_its_ca_secret_verifies(tmp_path: Path, workers: str) -> None:
    with KubeAPI(tmp_path / "kubeapi", bookmark_interval=0.5) as api:
        api.namespace("ignition")
        for name, hostname in CLUSTERS.items():
            world = hcp_world(name, services=route(hostname))
            for obj in world.objects():
                obj["metadata"] = {k: v for k, v in obj["metadata"].items() if k not in ("uid", "resourceVersion", "creationTimestamp")}
                api.create(obj)
        (tmp_path / "empty").mkdir()
        proc = ServerProcess(tmp_path / "empty", tmp_path / "ours" / "cache", extra=[
            "--kubernetes", "--kubeconfig", str(api.kubeconfig), "--pod-namespace", "ignition", "--take-over",
            "--workers", workers]).start()
        try:
            cas = {}
            for name in CLUSTERS:
                secret = wait_for(lambda name=name: api.get("secrets", f"clusters-{name}", ca_cert.NAME), timeout=30,
                                  what=f"the CA Secret of clusters-{name}")
                cas[name] = tmp_path / f"{name}-ca.crt"
                cas[name].write_bytes(base64.b64decode(secret["data"]["tls.crt"]))  # what the NodePool controller reads

            for name, hostname in CLUSTERS.items():
                verdict, san = wait_for(lambda name=name, hostname=hostname: (
                    got := handshake(proc.port, hostname, cas[name]))[0].endswith("(ok)") and got,
                    timeout=20, what=f"a verified certificate for {hostname}")
                assert f"DNS:{hostname}" in san, san
                others = [h for h in CLUSTERS.values() if h != hostname]
                assert not any(h in san for h in others), f"{hostname}'s certificate names another cluster's host: {san}"

            # A name no taken-over cluster publishes gets the default certificate (--public-url's),
            # which does not cover it: nothing is signed for a name the server was not told.
            verdict, san = handshake(proc.port, "attacker.example.com", cas["alpha"])
            assert not verdict.endswith("(ok)") and "attacker" not in san, (verdict, san)

            # A cluster's Route removed (the annotation gone): its name is no longer served.
            api.patch("hostedcontrolplanes", "clusters-gamma", "gamma",
                      {"metadata": {"annotations": {"hypershift.openshift.io/disable-ignition-server": None}}})
            wait_for(lambda: not handshake(proc.port, CLUSTERS["gamma"], cas["gamma"])[0].endswith("(ok)"),
                     timeout=20, what="gamma's hostname no longer served")
            assert handshake(proc.port, CLUSTERS["alpha"], cas["alpha"])[0].endswith("(ok)")
        finally:
            proc.kill()
