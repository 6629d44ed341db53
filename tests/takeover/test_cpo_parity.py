"""The takeover's ConfigMaps against HyperShift's own code: for each HostedControlPlane below,
`hcp-inputs` (the control-plane-operator's functions built from HyperShift's source, run on the
same objects) and `ignition_server.takeover` must write the same ConfigMaps: the same names, every
data key byte for byte, the same labels and owner. No normalisation: a diff is a failure.

The HCPs span the platforms (None, Agent as HyperShift hands it to the HCP, AWS, Azure, IBMCloud,
KubeVirt, GCP, PowerVS, OpenStack), with and without an SSH key, FIPS, mirrors, a proxy (noProxy
computed), a private endpoint, TLS profiles, dual-stack networks, a `baseDomainPrefix`, a trusted
bundle (serialized whole, metadata and managedFields included), and strings go-yaml must quote,
fold or sort its own way.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ignition_server.takeover.cluster_config import ARO_HCP, SWIFT_ANNOTATION
from ignition_server.takeover.core_ignition import CORE_LABEL, core_config_maps, names
from ignition_server.takeover.mcs_config import HASH_KEY, configuration_hash, mcs_config_map
from testsupport.hcp_inputs import HcpInputs, HcpWorld, hcp_world

V4 = {"networkType": "OVNKubernetes", "clusterNetwork": [{"cidr": "10.132.0.0/14"}],
      "serviceNetwork": [{"cidr": "172.31.0.0/16"}], "machineNetwork": [{"cidr": "10.0.0.0/16"}]}
DUAL = {"networkType": "OVNKubernetes",
        "clusterNetwork": [{"cidr": "10.128.0.0/14", "hostPrefix": 24}, {"cidr": "fd01:0:0::/48"}],
        "serviceNetwork": [{"cidr": "172.30.0.0/16"}, {"cidr": "fd02::0/112"}],
        "machineNetwork": [{"cidr": "192.168.126.10/24"}, {"cidr": "fd2e:6f44:5dd8:c956:0000::/120"}]}
PROXY = {"httpProxy": "http://proxy.corp.example:3128", "httpsProxy": "https://proxy.corp.example:3129",
         "noProxy": ".corp.example,,10.99.0.0/16", "trustedCA": {"name": "user-ca-bundle"}}
MIRRORS = [{"source": "quay.io/openshift-release-dev/ocp-release",
            "mirrors": ["mirror-a.example:5000/ocp/release", "mirror-b.example/ocp"]},
           {"source": "quay.io/openshift-release-dev/ocp-v4.0-art-dev", "mirrors": ["mirror-a.example:5000/ocp/art"]},
           {"source": "registry.redhat.io/no-mirrors-yet"}]
# Values go-yaml quotes (they would read back as something else), folds (over 80 columns) or leaves plain.
AWKWARD = ["true", "Yes", "off", "123", "0x1F", "0o17", "08", "1e3", ".5", "+.inf", "1_000", "2026-01-02", "12:30:45",
           "null", "~", "", " leading", "trailing ", "a: b", "- item", "#hash", "ends:", "'quoted'", '"double"',
           "café ☃", "x" * 90, " ".join(["word"] * 30), "tab\there", "<&>"]
CONFIGURATION = {
    "apiServer": {"audit": {"profile": "WriteRequestBodies"}, "clientCA": {"name": "client-ca"},
                  "servingCerts": {"namedCertificates": [{"names": ["api.custom.example"],
                                                          "servingCertificate": {"name": "custom-cert"}}]},
                  "tlsSecurityProfile": {"type": "Custom", "custom": {"ciphers": ["ECDHE-ECDSA-AES128-GCM-SHA256"],
                                                                       "minTLSVersion": "VersionTLS12"}},
                  "additionalCORSAllowedOrigins": ["(?i)//my\\.subdomain\\.domain\\.com(:|\\z)"]},
    "image": {"additionalTrustedCA": {"name": "registry-cas"}, "allowedRegistriesForImport": [{"domainName": "quay.io"}],
              "registrySources": {"blockedRegistries": ["untrusted.example"], "insecureRegistries": ["insecure.example"]}},
    "network": {"externalIP": {"policy": {"allowedCIDRs": ["192.0.2.0/24"]}}, "serviceNodePortRange": "30000-32767"},
    "oauth": {"tokenConfig": {"accessTokenMaxAgeSeconds": 86400, "accessTokenInactivityTimeout": "300s"},
              "identityProviders": [{"name": "corp <ldap> & co", "mappingMethod": "claim", "type": "HTPasswd",
                                     "htpasswd": {"fileData": {"name": "htpass"}}}]},
    "featureGate": {"featureSet": "TechPreviewNoUpgrade"},
    "ingress": {"domain": "apps.custom.example", "loadBalancer": {"platform": {"type": ""}}},
    "scheduler": {"profile": "HighNodeUtilization", "defaultNodeSelector": "type=user-node"},
    "proxy": PROXY,
}


def aws(**platform: Any) -> dict[str, Any]:
    return {"type": "AWS", "aws": {"region": "us-east-1", **platform}}


CASES: dict[str, dict[str, Any]] = {
    "none-minimal": {},
    "none-no-ssh-key": {"ssh_key": None},
    "none-fips-mirrors-trusted-proxy-modern-tls": {
        "fips": True, "mirrors": MIRRORS, "trusted": True,
        "configuration": {"apiServer": {"audit": {"profile": "Default"}, "tlsSecurityProfile": {"type": "Modern", "modern": {}}},
                          "proxy": {"httpProxy": "http://proxy.example.com:3128", "noProxy": ".corp,10.1.0.0/16"}}},
    "none-empty-configuration": {"configuration": {}},
    "none-the-whole-configuration": {"configuration": CONFIGURATION, "trusted": True},
    "agent-as-the-hcp-sees-it": {"platform": {"type": "None", "agent": {"agentNamespace": "agents"}},
                                 "dns": {"baseDomain": "example.com", "baseDomainPrefix": ""}},
    "aws-private-us-east-1-proxy-shared-vpc": {
        "platform": aws(endpointAccess="Private",
                        resourceTags=[{"key": "kubernetes.io/cluster/x", "value": "owned"}]
                        + [{"key": f"tag-{i:02d}", "value": v} for i, v in enumerate(AWKWARD)],
                        sharedVPC={"rolesRef": {"ingressARN": "arn:aws:iam::123:role/ingress",
                                                "controlPlaneARN": "arn:aws:iam::123:role/cp"}, "localZoneID": "Z1"}),
        "configuration": {"proxy": PROXY}, "kubeAPIServerDNSName": "api.custom.example",
        "dns": {"baseDomain": "example.com", "publicZoneID": "Z0PUBLIC", "privateZoneID": "Z0PRIVATE"}},
    "aws-public-and-private-us-west-2-mirrors": {"platform": aws(region="us-west-2", endpointAccess="PublicAndPrivate"),
                                                 "configuration": {"proxy": {"httpsProxy": "https://p.example:443"}},
                                                 "mirrors": MIRRORS[:1], "fips": True},
    "azure-private-proxy": {"platform": {"type": "Azure", "azure": {"cloud": "AzureUSGovernmentCloud", "location": "usgovvirginia",
                                                                    "resourceGroup": "rg-hc1", "topology": "Private"}},
                            "configuration": {"proxy": {"httpProxy": "http://p.example:80"}}},
    "azure-swift-default-cloud": {"platform": {"type": "Azure", "azure": {"resourceGroup": "rg", "private": {"type": "Swift"}}}},
    "ibmcloud-single-replica-no-key": {"platform": {"type": "IBMCloud", "ibmcloud": {"providerType": "UPI"}},
                                       "ssh_key": None, "infrastructureAvailabilityPolicy": "SingleReplica",
                                       "dns": {"baseDomain": "ibm.example", "baseDomainPrefix": "custom"}},
    "kubevirt-dual-stack-ipv6-endpoint": {"platform": {"type": "KubeVirt", "kubevirt": {"baseDomainPassthrough": True}},
                                          "networking": DUAL, "endpoint": ("fd00:10::1", 443),
                                          "configuration": {"proxy": {"httpProxy": "http://[fd00::5]:3128"}}},
    "gcp-labels-psc": {"platform": {"type": "GCP", "gcp": {"project": "my-proj", "region": "us-central1",
                                                           "endpointAccess": "PublicAndPrivate",
                                                           "resourceLabels": [{"key": "kubernetes-io-x", "value": "y"},
                                                                              {"key": "team", "value": "infra"},
                                                                              {"key": "bare"}]}}},
    "powervs": {"platform": {"type": "PowerVS", "powervs": {"region": "us-south", "zone": "dal10", "cisInstanceCRN": "crn:v1:x",
                                                             "resourceGroup": "rg", "accountID": "a", "subnet": {"id": "s"},
                                                             "vpc": {"name": "v", "region": "us-south"}}}},
    "openstack": {"platform": {"type": "OpenStack", "openstack": {"identityRef": {"name": "cloud", "cloudName": "openstack"}}}},
    "none-cidrs-as-go-prints-them": {
        "networking": {"networkType": "OVNKubernetes",
                       "clusterNetwork": [{"cidr": "10.132.0.7/14"}, {"cidr": "::ffff:10.0.0.0/104"}, {"cidr": "::ffff:10.0.0.0/64"}],
                       "serviceNetwork": [{"cidr": "172.31.0.0/16"}, {"cidr": "::1.2.3.0/120"}],
                       "machineNetwork": [{"cidr": "2001:DB8:0:0:1::/80"}, {"cidr": "::/0"}, {"cidr": "0.0.0.0/0"}]},
        "configuration": {"proxy": {"httpProxy": "http://p.example:1"}}},
    "none-empty-proxy-and-network": {"configuration": {"proxy": {}, "network": {}}},
    "ssh-key-folded-no-newline": {"ssh_key": "ssh-rsa " + "A" * 60 + " a comment that runs past eighty columns " * 2},
}


def world_for(case: str) -> HcpWorld:
    return hcp_world(**CASES[case])


def ours(world: HcpWorld, managed_service: str = "") -> dict[str, dict[str, Any]]:
    named = world.named()
    return {"machine-config-server": mcs_config_map(world.hcp, named, managed_service), **core_config_maps(world.hcp, named)}


def assert_same(cpo: dict[str, Any], mine: dict[str, Any]) -> None:
    name = cpo["metadata"]["name"]
    assert sorted(mine["data"]) == sorted(cpo["data"]), name
    for key in cpo["data"]:
        assert mine["data"][key] == cpo["data"][key], f"{name} {key}"
    for field in ("name", "namespace", "labels", "ownerReferences"):
        assert mine["metadata"].get(field) == cpo["metadata"].get(field), f"{name} metadata.{field}"


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_config_maps_are_the_cpos_byte_for_byte(case: str, hcp_inputs: HcpInputs, tmp_path: Path) -> None:
    world = world_for(case)
    cpo = hcp_inputs.run(world.objects(), tmp_path)
    mine = ours(world)
    assert sorted(mine) == sorted(cpo.config_maps)
    for name, config_map in cpo.config_maps.items():
        assert_same(config_map, mine[name])
    assert set(names(world.hcp)) == {n for n, cm in cpo.config_maps.items()
                                     if (cm["metadata"].get("labels") or {}).get(CORE_LABEL) == "true"}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_configuration_hash_is_the_one_the_nodepool_controller_writes(case: str, hcp_inputs: HcpInputs,
                                                                          tmp_path: Path) -> None:
    """HyperShift's NodePool controller writes `hc-configuration-hash` with the function the CPO
    uses for `configuration-hash` (backwardcompat.GetBackwardCompatibleConfigHash), on the
    HostedCluster's `spec.configuration`, which HyperShift copies into the HCP unchanged.
    hcp-inputs prints the value that function returned."""
    world = world_for(case)
    cpo = hcp_inputs.run(world.objects(), tmp_path)
    assert configuration_hash(world.hcp) == cpo.printed_hash == cpo.config_maps["machine-config-server"]["data"][HASH_KEY]


def test_the_trusted_bundle_is_serialized_as_read(hcp_inputs: HcpInputs, tmp_path: Path) -> None:
    """Another resourceVersion or managedFields entry of trusted-ca-bundle-managed changes the CPO's
    user-ca-bundle-config.yaml, and ours alike; an empty one writes no key at all."""
    world = hcp_world(trusted=True)
    assert world.trusted_bundle is not None
    world.trusted_bundle["metadata"]["resourceVersion"] = "48214"
    world.trusted_bundle["metadata"]["labels"].update({"a10": "x", "a9": "y", "a09": "z", "B": "upper"})
    # keys over 128 bytes are complex keys (`? key`) for go-yaml; é counts twice
    world.trusted_bundle["metadata"]["labels"].update({"y" * 128: "simple", "q" * 129: "complex", "é" * 64: "simple",
                                                       "é" * 65: "complex"})
    world.trusted_bundle["metadata"]["annotations"] = {"note": "two\nlines", "long": "x" * 300}
    world.trusted_bundle["binaryData"] = {"blob": "AAEC"}
    world.trusted_bundle["metadata"]["managedFields"][0]["time"] = "2026-11-02T10:15:00.75+02:00"  # Go prints UTC, seconds
    cpo = hcp_inputs.run(world.objects(), tmp_path / "changed")
    assert_same(cpo.config_maps["machine-config-server"], ours(world)["machine-config-server"])
    world.trusted_bundle.pop("binaryData")
    world.trusted_bundle["data"] = {}
    cpo = hcp_inputs.run(world.objects(), tmp_path / "empty")
    assert "user-ca-bundle-config.yaml" not in cpo.config_maps["machine-config-server"]["data"]
    assert_same(cpo.config_maps["machine-config-server"], ours(world)["machine-config-server"])


AZURE_RG = {"type": "Azure", "azure": {"resourceGroup": "rg-hc1"}}
# ARO-HCP's private-endpoint fallback (netutil.IsPrivateHCP -> UseSwiftNetworkingHCP): the CPO reads
# MANAGED_SERVICE from its environment; our server is told it with --managed-service.
MANAGED_CASES: dict[str, tuple[dict[str, Any], str | None]] = {
    "azure-swift-annotation": (AZURE_RG, "swift-instance-1"),
    "azure-swift-annotation-empty": (AZURE_RG, ""),
    "azure-no-annotation": (AZURE_RG, None),
    "azure-public-topology-swift-annotation": ({"type": "Azure", "azure": {"resourceGroup": "rg", "topology": "Public"}},
                                               "swift-instance-1"),
    "aws-public-swift-annotation": (aws(endpointAccess="Public"), "swift-instance-1"),
    "none-swift-annotation": ({"type": "None"}, "swift-instance-1"),
}


def managed_world(case: str) -> HcpWorld:
    platform, annotation = MANAGED_CASES[case]
    world = hcp_world(platform=platform)
    if annotation is not None:
        world.hcp["metadata"]["annotations"][SWIFT_ANNOTATION] = annotation
    return world


@pytest.mark.parametrize("managed_service", ["", ARO_HCP, "ROSA-HCP"])
@pytest.mark.parametrize("case", sorted(MANAGED_CASES))
def test_the_managed_services_private_endpoint_is_the_cpos(case: str, managed_service: str, hcp_inputs: HcpInputs,
                                                            tmp_path: Path) -> None:
    """hcp-inputs run with the CPO's MANAGED_SERVICE in its environment, ours with --managed-service's value."""
    world = managed_world(case)
    cpo = hcp_inputs.run(world.objects(), tmp_path, env={"MANAGED_SERVICE": managed_service} if managed_service else None)
    mine = ours(world, managed_service)
    assert sorted(mine) == sorted(cpo.config_maps)
    for name, config_map in cpo.config_maps.items():
        assert_same(config_map, mine[name])


def test_on_aro_hcp_the_swift_annotation_makes_the_endpoint_private(hcp_inputs: HcpInputs, tmp_path: Path) -> None:
    """The case above that tells the settings apart: the same HCP, internal API URI public without
    MANAGED_SERVICE and `api.<name>.hypershift.local` with it, in the CPO's output and ours."""
    world = managed_world("azure-swift-annotation")
    key = "cluster-infrastructure-02-config.yaml"
    elsewhere = hcp_inputs.run(world.objects(), tmp_path / "plain").config_maps["machine-config-server"]["data"][key]
    on_aro = hcp_inputs.run(world.objects(), tmp_path / "aro", env={"MANAGED_SERVICE": ARO_HCP}
                            ).config_maps["machine-config-server"]["data"][key]
    assert "apiServerInternalURI: https://api.hc1.hypershift.local:" in on_aro
    assert "hypershift.local" not in elsewhere
    assert ours(world, ARO_HCP)["machine-config-server"]["data"][key] == on_aro
    assert ours(world)["machine-config-server"]["data"][key] == elsewhere
