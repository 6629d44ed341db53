"""Kubernetes mode end to end: real server processes (`serve --kubernetes`) against the strict
test API server over TLS, the same token Secrets as the file source, several replicas."""

from __future__ import annotations

import base64
import threading
import time
from pathlib import Path

import pytest

from testsupport.deploy import rbac_rules
from testsupport.harness import EXAMPLE_MACHINECONFIG, ServerProcess, bearer, wait_for
from testsupport.kubeapi import KubeAPI
from testsupport.manifests import build_token_secret

NAMESPACE = "clusters-a"


def token_secret(pool: str, token: str, *, generation_time: float | None = None) -> dict:
    return build_token_secret(namespace=NAMESPACE, nodepool=f"clusters/{pool}", token=token,
                              machineconfigs_yaml=EXAMPLE_MACHINECONFIG.format(name=pool),
                              generation_time=time.time() if generation_time is None else generation_time)


def token_of(api: KubeAPI, name: str) -> str | None:
    return listed_token(api, name, "token")


def listed_token(api: KubeAPI, name: str, key: str) -> str | None:
    """The Secret's `token` or `old_token` as the API holds it now."""
    secret = api.get("secrets", NAMESPACE, name)
    value = (secret or {}).get("data", {}).get(key)
    return base64.b64decode(value).decode() if value else None


@pytest.fixture
def api(tmp_path: Path):
    with KubeAPI(tmp_path / "kubeapi", bookmark_interval=0.5) as server:
        server.namespace("ignition")
        server.namespace(NAMESPACE)
        yield server


@pytest.fixture
def replicas(tmp_path: Path, api: KubeAPI):
    started: list[ServerProcess] = []

    def start(name: str, token_ttl: str = "11h", wait: bool = True, extra: tuple[str, ...] = ()) -> ServerProcess:
        (tmp_path / "empty").mkdir(exist_ok=True)
        proc = ServerProcess(tmp_path / "empty", tmp_path / name / "cache", token_ttl=token_ttl, extra=[
            "--kubernetes", "--kubeconfig", str(api.kubeconfig), "--pod-namespace", "ignition",
            "--replica-id", name, "--lease-duration", "3s", *extra])
        started.append(proc)
        return proc.start(wait=wait)

    yield start
    for proc in started:
        proc.kill()


def lease_time(api: KubeAPI, field: str) -> float:
    import datetime as dt

    lease = api.get("leases", "ignition", "ignition-server")
    assert lease is not None
    return dt.datetime.fromisoformat(lease["spec"][field].replace("Z", "+00:00")).timestamp()


def served(proc: ServerProcess, token: str) -> bool:
    return proc.get("/ignition", bearer(token))[0] == 200


def watching(proc: ServerProcess) -> bool:
    """Its Secret watch is up: a Secret created now reaches it as an event, not a start-up."""
    return proc.metrics().get('ign_server_source_watch_up{kind="Secret"}') == 1


def test_a_token_secret_in_the_api_is_served_and_rotated_by_patch(api: KubeAPI, replicas) -> None:
    secret = api.create(token_secret("workers", "tok-first"))
    name = secret["metadata"]["name"]
    # A rotation every 8 s: room for a loaded machine to start the replica and check the overlap
    # before tok-first retires (with 6 s it had 3 s after the rotation, and 6 s to start).
    proc = replicas("r1", token_ttl="16s")
    wait_for(lambda: served(proc, "tok-first"), timeout=30, what="the payload served")
    # Rotation at half the TTL: the new token is patched in with a resourceVersion precondition.
    wait_for(lambda: token_of(api, name) != "tok-first", timeout=30, what="a rotation written to the API")
    rotated = api.get("secrets", NAMESPACE, name)
    assert base64.b64decode(rotated["data"]["old_token"]).decode() == "tok-first"
    new = token_of(api, name)
    assert served(proc, new) and served(proc, "tok-first")  # the overlap
    assert api.server.requests[("patch", "secrets")] >= 1 and api.server.requests[("update", "secrets")] == 0
    # Metadata only: the server never listed Secrets' data (it GETs the ones it reads).
    assert api.server.requests[("list", "secrets")] >= 1
    # The user-data Secret next to it carries the current token (as the pointer config's Bearer value).
    def user_data_current() -> bool:
        wanted = base64.b64encode(token_of(api, name).encode()).decode()
        return any(s["metadata"]["name"].startswith("user-data-") and wanted in base64.b64decode(s["data"]["value"]).decode()
                   for s in api.list("secrets", NAMESPACE))

    wait_for(user_data_current, timeout=30, what="user-data with the current token")
    assert "Lease ignition/ignition-server acquired by r1" in proc.logs()
    # Everything it asked of the API server is allowed by deploy/'s RBAC, and nothing else was needed.
    groups = {"leases": "coordination.k8s.io"}
    used = {(groups.get(plural, ""), plural, verb) for verb, plural in api.server.requests}
    assert used <= rbac_rules(), used - rbac_rules()


def test_a_service_account_signing_key_is_never_read(api: KubeAPI, replicas) -> None:
    api.create({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "sa-signing-key", "namespace": NAMESPACE},
                "data": {"service-account.key": base64.b64encode(b"-----BEGIN PRIVATE KEY-----").decode()}})
    api.create(token_secret("workers", "tok-a"))
    proc = replicas("r1")
    wait_for(lambda: served(proc, "tok-a"), timeout=30, what="the payload served")
    read = {name for plural, namespace, name in api.server.reads if plural == "secrets" and namespace == NAMESPACE}
    assert any(name.startswith("token-workers") for name in read)
    assert "sa-signing-key" not in read  # listed and watched as metadata only, never fetched


def test_watches_that_drop_and_expire_lose_nothing_and_render_once(api: KubeAPI, replicas) -> None:
    api.server.faults.watch_max_seconds = 1.0  # every stream ends after a second
    proc = replicas("r1")

    def restarts(reason: str) -> float:
        return sum(v for k, v in proc.metrics().items()
                   if k.startswith("ign_server_source_watch_restarts_total") and f'reason="{reason}"' in k)

    for i in range(2):
        api.create(token_secret(f"pool{i}", f"tok-{i}"))
    wait_for(lambda: restarts("ended") >= 2, timeout=30, what="watch streams ended and resumed")
    api.server.faults.gone_next_watches = 4  # the next resumes answer 410 Gone: list again
    api.create(token_secret("pool2", "tok-2"))
    wait_for(lambda: restarts("gone") >= 1, timeout=30, what="a 410 and a new listing")
    api.create(token_secret("pool3", "tok-3"))
    for i in range(4):
        wait_for(lambda i=i: served(proc, f"tok-{i}"), timeout=30, what=f"pool{i} served")
    assert proc.get("/readyz")[0] == 200  # held throughout: serving from the cache
    assert proc.metrics()["ign_server_payload_cache_miss_total"] == 4  # one render each, none repeated


def test_the_api_server_down_for_a_while(api: KubeAPI, replicas) -> None:
    proc = replicas("r1", token_ttl="16s")
    wait_for(lambda: watching(proc) and proc.metrics().get("ign_server_leader") == 1, timeout=30,
             what="r1 watching and holding the Lease")
    # Created once r1 runs, so that the 8 s to its rotation are not spent starting the replica:
    # created before, a loaded replica (load 6-18) served it late and rotated before the outage.
    name = api.create(token_secret("workers", "tok-a"))["metadata"]["name"]
    wait_for(lambda: served(proc, "tok-a"), timeout=30, what="the payload served")
    api.stop()
    wait_for(lambda: proc.metrics().get('ign_server_source_watch_up{kind="Secret"}') == 0, timeout=30,
             what="the watch seen down")
    assert served(proc, "tok-a")  # serving goes on from the cache
    assert "behind: Secret watch reconnecting" in proc.get("/readyz")[2].decode()
    # It cannot renew its Lease, so it stops writing (another replica could hold it by now);
    # the rotation that falls due meanwhile (at 8 s) waits, and is written once it is back.
    wait_for(lambda: proc.metrics().get("ign_server_leader") == 0, timeout=30, what="the writer standing down")
    # A minute down, past the rotation's due time: every NodePool keeps booting from the cache,
    # and nothing is handed out that could not be written.
    down_until = time.monotonic() + 60
    while time.monotonic() < down_until:
        assert served(proc, "tok-a")
        time.sleep(1)
    assert proc.metrics().get("ign_server_token_rotation_total", 0) == 0
    api.start()
    api.create(token_secret("later", "tok-later"))
    wait_for(lambda: served(proc, "tok-later"), timeout=60, what="a Secret made after the outage served")
    wait_for(lambda: token_of(api, name) != "tok-a", timeout=60, what="the rotation written after the outage")

    def overlap() -> bool:
        """The current token and the one before it (tok-a, or a later one under load) both served.
        A rotation (every 8 s) landing between the read and the requests retired the previous
        one (seen under load: served, not served): read again then, rather than failing."""
        current = api.get("secrets", NAMESPACE, name)["data"]
        rotated, previous = (base64.b64decode(current[k]).decode() for k in ("token", "old_token"))
        both = (served(proc, rotated), served(proc, previous))
        if token_of(api, name) != rotated:
            return False
        assert all(both), both  # no rotation meanwhile: the writer serves what it wrote
        return True

    wait_for(overlap, timeout=30, what="the overlap served")
    writes = [e for e in api.server.store.history if e.type == "MODIFIED" and e.obj["metadata"]["name"] == name
              and "old_token" in e.obj.get("data", {})]
    assert len({e.obj["data"]["token"] for e in writes}) == len(writes)  # no token written twice


def test_three_replicas_converge_and_exactly_one_writes(api: KubeAPI, replicas) -> None:
    secret = api.create(token_secret("workers", "tok-0", generation_time=time.time()))
    name = secret["metadata"]["name"]
    procs = [replicas(f"r{i}", token_ttl="3s") for i in range(3)]
    seen: list[str] = []
    deadline = time.monotonic() + 120
    while len(seen) < 21 and time.monotonic() < deadline:  # the first token and 20 rotations
        token = token_of(api, name)
        if token and (not seen or seen[-1] != token):
            seen.append(token)
            # Every replica converges on the token the writer wrote (the old one stays good meanwhile).
            for proc in procs:
                wait_for(lambda proc=proc, token=token: served(proc, token), timeout=20, what="a replica serving the new token")
        time.sleep(0.05)
    assert len(seen) >= 21 and len(set(seen)) == len(seen), seen
    rotations = [p.metrics().get("ign_server_token_rotation_total", 0) for p in procs]
    leaders = [p.metrics().get("ign_server_leader", 0) for p in procs]
    assert sum(leaders) == 1 and sum(1 for r in rotations if r) == 1, (rotations, leaders)
    # Exactly one write per rotation: every token the API held was written once.
    token_writes = [e for e in api.server.store.history if e.type == "MODIFIED"
                    and (e.obj.get("metadata") or {}).get("name") == name]
    tokens_written = [base64.b64decode(e.obj["data"]["token"]).decode() for e in token_writes]
    assert len(set(tokens_written)) == len([t for i, t in enumerate(tokens_written) if i == 0 or tokens_written[i - 1] != t])

    # The writer killed: another replica takes the Lease within its duration and rotates on.
    writer = procs[leaders.index(1)]
    writer.kill()
    survivors = [p for p in procs if p is not writer]
    last_renewed = lease_time(api, "renewTime")  # the dead writer's last renewal: it renews no more
    wait_for(lambda: sum(p.metrics().get("ign_server_leader", 0) for p in survivors) == 1, timeout=60,
             interval=0.1, what="a survivor holding the Lease")
    # Taken over once it had expired, never before (the Lease's own times, not how fast this
    # test's process got to look): within its duration, a retry's half renew interval to
    # notice, and slack for a loaded machine.
    taken = lease_time(api, "acquireTime") - last_renewed
    assert 3 <= taken < 3 + 0.5 + 10, taken
    before = token_of(api, name)
    wait_for(lambda: token_of(api, name) != before, timeout=30, what="a rotation by the new writer")
    for proc in survivors:
        wait_for(lambda proc=proc: served(proc, token_of(api, name)), timeout=20, what="survivors serving it")


def fetch_status(proc: ServerProcess, token: str) -> tuple[int, str]:
    """Status and, for a refusal, its reason; 0 when nothing answered in time (a loaded machine)."""
    try:
        status, _, body = proc.get("/ignition", bearer(token))
    except OSError:  # urllib's URLError and timeouts too
        return 0, "no answer"
    return status, body[:80].decode(errors="replace").strip() if status != 200 else ""


def test_three_replicas_never_refuse_the_apis_token_through_rotations_and_an_outage(api: KubeAPI, replicas) -> None:
    # A node reads nothing but what the API holds: whatever replica it reaches, whoever holds
    # the Lease, whatever the API's state, the token the API lists must never get a 4xx (the
    # Ignition client gives up on one for good). 8 s TTL: a rotation every 4 s.
    name = api.create(token_secret("workers", "tok-0", generation_time=time.time()))["metadata"]["name"]
    procs = [replicas(f"r{i}", token_ttl="8s") for i in range(3)]
    for proc in procs:
        wait_for(lambda proc=proc: served(proc, token_of(api, name)), timeout=60, what="every replica serving")
    refused: list[tuple[str, str, int, str]] = []  # (phase, replica, status, reason)
    served_by = {proc.port: 0 for proc in procs}
    tokens: set[str] = set()

    def fetch_for(seconds: float, phase: str) -> None:
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            for number, proc in enumerate(procs):
                # Both tokens the API lists: a node may hold either (old_token until the next rotation).
                for key in ("token", "old_token"):
                    token = listed_token(api, name, key)
                    if token is None:
                        continue
                    tokens.add(token)
                    status, reason = fetch_status(proc, token)
                    # A rotation between reading the API and asking retires an old_token for good:
                    # a refusal counts only for a token the API still lists after it.
                    if 400 <= status < 500 and token in (token_of(api, name), listed_token(api, name, "old_token")):
                        refused.append((phase, f"r{number} {key}", status, reason))
                    served_by[proc.port] += status == 200

    def overdue() -> float:
        return max(proc.metrics().get("ign_server_rotation_overdue_secrets", 0) for proc in procs)

    fetch_for(30, "rotating")
    assert len(tokens) >= 3, tokens  # rotations went on (one every 4 s; fewer on a loaded machine)
    api.server.faults.unavailable = True  # every API request 503: no rotation can be written
    outage_token = token_of(api, name)
    fetch_for(20, "API down")
    # Overdue, and visible as such; and still the token the API holds is served.
    wait_for(lambda: overdue() >= 1, timeout=30, what="the rotation seen overdue")
    assert token_of(api, name) == outage_token
    api.server.faults.unavailable = False
    fetch_for(30, "after the outage")
    wait_for(lambda: token_of(api, name) != outage_token, timeout=30, what="rotation going on after the outage")
    wait_for(lambda: overdue() == 0, timeout=30, what="no rotation overdue once the API is back")
    assert refused == [], refused[:20]
    assert all(count > 0 for count in served_by.values()), served_by
    assert len(tokens) >= 5, len(tokens)


def test_a_new_writer_losing_to_the_old_ones_late_rotation_keeps_serving_it(api: KubeAPI, replicas) -> None:
    # The Lease passes while the old writer's rotation is still on its way to etcd (a slow
    # API: the test API server holds token writes). The new writer, not knowing of it, rotates
    # too; the old writer's write lands first and the new one's conflicts. The new writer then
    # holds the Lease while the API lists the old writer's token: every replica must serve it,
    # the new writer included (it answered '403 token was rotated out' until its next rotation
    # landed).
    name = api.create(token_secret("workers", "tok-0", generation_time=time.time()))["metadata"]["name"]
    procs = {f"r{i}": replicas(f"r{i}", token_ttl="8s") for i in range(3)}
    for proc in procs.values():
        wait_for(lambda proc=proc: served(proc, token_of(api, name)), timeout=60, what="every replica serving")
    refused: list[tuple[str, int, str]] = []
    fetches = {replica: 0 for replica in procs}
    stop = threading.Event()

    def fetch_all_the_time() -> None:
        while not stop.is_set():
            for replica, proc in procs.items():
                token = token_of(api, name)
                assert token is not None
                status, reason = fetch_status(proc, token)
                fetches[replica] += 1
                if 400 <= status < 500:
                    refused.append((replica, status, reason))

    def leader() -> str | None:
        return next((r for r, p in procs.items() if p.metrics().get("ign_server_leader") == 1), None)

    faults = api.server.faults
    fetching = threading.Thread(target=fetch_all_the_time, daemon=True)
    fetching.start()
    try:
        old_writer = wait_for(leader, timeout=30, what="a writer")
        faults.hold_token_writes = True
        wait_for(lambda: api.server.token_writes_held >= 1, timeout=30, what="the writer's rotation on its way")
        faults.refuse_lease_holder = old_writer  # it cannot renew: the Lease passes
        new_writer = wait_for(lambda: (r := leader()) not in (None, old_writer) and r, timeout=30, interval=0.1,
                              what="another replica holding the Lease")
        wait_for(lambda: api.server.token_writes_held >= 2, timeout=30, what="the new writer's own rotation")
        conflicts = api.server.refusals[409]
        faults.hold_token_writes = False  # the old writer's lands, then the new writer's conflicts
        wait_for(lambda: api.server.refusals[409] > conflicts, timeout=30, what="the new writer's write conflicting")
        faults.hold_token_writes = True  # its next rotation is slow too: meanwhile the API lists the old writer's token
        landed = token_of(api, name)
        wait_for(lambda: api.server.token_writes_held >= 3, timeout=30, what="the new writer's next rotation")
        asked = fetches[new_writer]
        wait_for(lambda: fetches[new_writer] >= asked + 10, timeout=60, what="the new writer asked for it, ten times")
        faults.hold_token_writes = False
        faults.refuse_lease_holder = None
        wait_for(lambda: token_of(api, name) != landed, timeout=30, what="the new writer rotating on")
        wait_for(lambda: served(procs[new_writer], token_of(api, name)), timeout=30, what="the new writer serving")
    finally:
        faults.hold_token_writes = False
        stop.set()
        fetching.join(30)
    assert refused == [], refused[:20]


def test_expired_token_secrets_are_deleted_with_their_user_data(api: KubeAPI, replicas) -> None:
    from ignition_server.model.token_secret import ANNOTATION_TOKEN_EXPIRATION, format_time

    api.create(token_secret("infra", "tok-infra"))
    proc = replicas("r1", extra=("--prune-expired-after", "1s"))
    wait_for(lambda: served(proc, "tok-infra"), timeout=30, what="r1 serving")
    # Created once r1 serves, so that its 4 s to expiry are not spent starting the replica: created
    # before, a loaded replica (load 7-15) took 5-6 s to its first payloads, and never served it.
    old = token_secret("workers", "tok-old")
    old["metadata"]["annotations"][ANNOTATION_TOKEN_EXPIRATION] = format_time(time.time() + 4)
    name = api.create(old)["metadata"]["name"]
    wait_for(lambda: served(proc, "tok-old"), timeout=30, what="served before its expiry")
    wait_for(lambda: any(s["metadata"]["name"].startswith("user-data-workers") for s in api.list("secrets", NAMESPACE)),
             timeout=30, what="its user-data written")
    wait_for(lambda: api.get("secrets", NAMESPACE, name) is None, timeout=30, what="the expired token Secret deleted")
    names = [s["metadata"]["name"] for s in api.list("secrets", NAMESPACE)]
    assert not any(n.startswith("user-data-workers") for n in names), names  # its user-data too
    assert any(n.startswith("user-data-infra") for n in names) and served(proc, "tok-infra")  # the live one stays
    assert proc.get("/ignition", bearer("tok-old"))[0] in (403, 511)  # never served after its expiry


def test_a_render_failure_is_an_event_on_the_token_secret(api: KubeAPI, replicas) -> None:
    bad = build_token_secret(namespace=NAMESPACE, nodepool="clusters/bad", token="tok-bad",
                             machineconfigs_yaml="kind: [broken", generation_time=time.time())
    name = api.create(bad)["metadata"]["name"]
    replicas("r1")
    wait_for(lambda: base64.b64decode((api.get("secrets", NAMESPACE, name)["data"].get("reason") or "")).decode()
             == "InvalidConfig", timeout=30, what="InvalidConfig on the Secret")
    wait_for(lambda: any(e["involvedObject"]["name"] == name and e["reason"] == "InvalidConfig"
                         for e in api.list("events", NAMESPACE)), timeout=30, what="an Event on the Secret")


def test_the_real_client_boots_from_a_replica_that_lags_a_rotation(api: KubeAPI, replicas, tmp_path: Path) -> None:
    from ignition_server.render.userdata import pointer_config
    from testsupport.ignition_client import finish_fetch, ignition_fetch, require_ignition

    require_ignition()
    writer = replicas("r1", token_ttl="16s")
    wait_for(lambda: writer.metrics().get("ign_server_leader") == 1, timeout=30, what="r1 holding the Lease")
    lagging = replicas("r2", token_ttl="16s")
    wait_for(lambda: watching(writer) and watching(lagging), timeout=30, what="both replicas watching")
    # Created once both run, so that the 8 s to its rotation are not spent starting r2: created
    # before, a loaded r2 (load 6-18) heard of the rotation before its watch was held (a 200).
    name = api.create(token_secret("workers", "tok-0"))["metadata"]["name"]
    wait_for(lambda: served(lagging, "tok-0"), timeout=30, what="r2 serving")
    api.server.faults.hold_events = True  # every watch stalls: r2 will not hear of the rotation
    wait_for(lambda: token_of(api, name) != "tok-0", timeout=30, what="the writer's rotation (at half the TTL)")
    new = token_of(api, name)
    assert served(writer, new)  # the writer applied its own write at once
    assert lagging.get("/ignition", bearer(new))[0] == 511  # not a 4xx: the node retries
    pointer = pointer_config(source_url=lagging.url, token=new, ca_pem=lagging.ca_file.read_bytes(), nodepool="clusters/workers")
    client = ignition_fetch(pointer, tmp_path / "node", background=True)
    wait_for(lambda: lagging.metrics().get('ign_server_responses_total{code="511"}', 0) >= 3, timeout=30,
             what="the client retrying the lagging replica")
    api.server.faults.hold_events = False  # the watch catches up
    output, _ = client.communicate(timeout=60)
    run = finish_fetch(client, output, tmp_path / "node")
    assert run.returncode == 0, output
    assert "/etc/workers.conf" in {f["path"] for f in run.config["storage"]["files"]}


def test_the_ca_is_renewed_with_an_overlap(api: KubeAPI, replicas, tmp_path: Path) -> None:
    """Pointer configs trust the next CA before any replica serves a certificate it signed;
    a pointer config holding only the old CA works until then."""
    import json
    import socket
    import ssl
    from urllib.parse import unquote

    from ignition_server.tls.ca_rotation import split_pem

    api.create(token_secret("workers", "tok-0"))
    flags = ("--ca-lifetime", "40s", "--ca-check-interval", "0.5s")
    procs = [replicas("r1", token_ttl="4s", extra=flags), replicas("r2", token_ttl="4s", extra=flags)]
    first_ca = split_pem(procs[0].ca_file.read_bytes())[0]

    def bundle() -> tuple[bytes, ...]:
        return split_pem(base64.b64decode(api.get("secrets", "ignition", "ignition-server-tls")["data"]["ca.crt"]))

    def pointer_cas() -> list[bytes]:
        found = []
        for secret in api.list("secrets", NAMESPACE):
            if secret["metadata"]["name"].startswith("user-data-"):
                pointer = json.loads(base64.b64decode(secret["data"]["value"]))
                source = pointer["ignition"]["security"]["tls"]["certificateAuthorities"][0]["source"]
                header, _, data = source.partition(",")
                found.append(base64.b64decode(data) if header.endswith(";base64") else unquote(data).encode())
        return found

    def handshake(proc: ServerProcess, ca: bytes) -> bool:
        context = ssl.create_default_context(cadata=ca.decode())
        try:
            with socket.create_connection(("127.0.0.1", proc.port), timeout=5) as raw:
                with context.wrap_socket(raw, server_hostname="127.0.0.1"):
                    return True
        except ssl.SSLError:
            return False

    added = wait_for(lambda: len(bundle()) == 2 and bundle(), timeout=60, interval=0.2, what="the next CA added")
    next_ca = added[1]
    assert all(handshake(p, first_ca) and not handshake(p, next_ca) for p in procs)  # still the old CA's
    # Every pointer config learns the next CA before any replica switches to it.
    wait_for(lambda: pointer_cas() and all(next_ca in cas and first_ca in cas for cas in pointer_cas()), timeout=30,
             interval=0.2, what="user-data trusting both CAs")
    assert all(handshake(p, first_ca) for p in procs)
    for proc in procs:
        wait_for(lambda proc=proc: handshake(proc, next_ca), timeout=30, interval=0.2, what="a replica serving the next CA's certificate")
    wait_for(lambda: bundle() == (next_ca,), timeout=30, interval=0.2, what="the old CA dropped after the overlap")


def test_a_deleted_token_secret_takes_its_user_data_along(api: KubeAPI, replicas) -> None:
    name = api.create(token_secret("workers", "tok-a"))["metadata"]["name"]
    proc = replicas("r1")

    def user_data() -> list[str]:
        return [s["metadata"]["name"] for s in api.list("secrets", NAMESPACE) if s["metadata"]["name"].startswith("user-data-")]

    wait_for(lambda: user_data(), timeout=30, what="its user-data written")
    api.delete("secrets", NAMESPACE, name)  # the NodePool is gone (HyperShift deletes its token Secret)
    wait_for(lambda: not user_data(), timeout=30, what="the orphaned user-data deleted")
    assert proc.get("/ignition", bearer("tok-a"))[0] == 403  # and its token opens nothing


def test_an_input_secret_named_by_annotation_is_fetched(api: KubeAPI, replicas) -> None:
    from ignition_server.reconcile.inputs import ANNOTATION_INPUT_PREFIX

    auth = base64.b64encode(b"user:pa55word-marker").decode()
    api.create({"apiVersion": "v1", "kind": "Secret", "metadata": {
                    "name": "shared-pull", "namespace": "shared",
                    "annotations": {"ignition-server.openshift.io/shareable": "true"}},  # the operator shares it
                "type": "kubernetes.io/dockerconfigjson",
                "data": {".dockerconfigjson": base64.b64encode(
                    ('{"auths":{"quay.io":{"auth":"%s"}}}' % auth).encode()).decode()}})
    secret = token_secret("workers", "tok-a")
    secret["metadata"]["annotations"][ANNOTATION_INPUT_PREFIX + "pull-secret"] = "shared/shared-pull"
    api.create(secret)
    proc = replicas("r1", extra=("--shared-namespaces", "shared"))  # another namespace: only when shared
    wait_for(lambda: served(proc, "tok-a"), timeout=30, what="the payload served")
    import json
    from urllib.parse import unquote

    from testsupport.ignition_client import files_in

    status, _, body = proc.get("/ignition", bearer("tok-a"))
    contents = []
    for source in files_in(json.loads(body)).values():
        header, _, data = source.partition(",")
        contents.append(base64.b64decode(data).decode(errors="replace") if header.endswith(";base64") else unquote(data))
    assert status == 200 and any(auth in content for content in contents)  # the pull secret from the other namespace
    assert ("secrets", "shared", "shared-pull") in api.server.reads  # fetched although its name is not a known input's


def test_a_restart_renders_nothing_though_the_catalog_is_listed_after_the_token_secrets(api: KubeAPI, replicas) -> None:
    """The first listing meets objects in creation order: here every token Secret before the
    release catalog that its payload (the node's API server proxy) reads. Applied whole before
    any NodePool is reconciled, a restart finds every payload current (issue 33)."""
    from ignition_server.reconcile.releases import ANNOTATION_RELEASE_CATALOG
    from testsupport.manifests import CA_PEM, join_objects, kube_object

    release = "quay.io/openshift-release-dev/ocp-release@sha256:" + "1" * 64
    haproxy = "quay.io/openshift-release-dev/ocp-v4.0-art-dev@sha256:" + "2" * 64
    for obj in join_objects(NAMESPACE, '{"auths":{"quay.io":{"auth":"dTpw"}}}', CA_PEM):
        api.create(obj)
    for i in range(4):
        api.create(build_token_secret(namespace=NAMESPACE, nodepool=f"clusters/pool{i}", token=f"tok-{i}",
                                      release=release, machineconfigs_yaml=EXAMPLE_MACHINECONFIG.format(name=f"pool{i}"),
                                      generation_time=time.time()))
    api.create(kube_object("ConfigMap", "ignition", "catalog", {"releases.yaml": (
        f"- pullSpec: {release}\n  version: 4.17.3\n  images:\n    haproxy-router: {haproxy}\n")},
        {ANNOTATION_RELEASE_CATALOG: "true"}))
    # Started after every object exists, so that its first listing too holds the catalog: started
    # before, a loaded replica reconciled the token Secrets' watch events before the catalog's
    # came, and was killed while re-rendering with it.
    proc = replicas("r1")

    def status(i: int) -> str:
        data = (api.get("secrets", NAMESPACE, f"token-pool{i}-00000000") or {}).get("data", {})
        return base64.b64decode(data.get("reason", "")).decode()

    for i in range(4):  # AsExpected is written once the payload is on disk: a SIGKILL from here loses nothing
        wait_for(lambda i=i: served(proc, f"tok-{i}") and status(i) == "AsExpected", timeout=30,
                 what=f"pool{i} served and said so")
    proc.kill()

    again = replicas("r1")
    wait_for(lambda: again.metrics().get('ign_server_reconciles_total{outcome="current"}', 0) >= 4, timeout=30,
             what="every NodePool reconciled after the restart")
    metrics = again.metrics()
    if metrics["ign_server_payload_cache_miss_total"]:
        print("FIRST", proc.logs()[-8000:])
        print("AGAIN", again.logs()[-8000:])
    assert metrics["ign_server_payload_cache_miss_total"] == 0
    assert sum(v for k, v in metrics.items() if k.startswith("ign_server_reconciles_total")) == 4
    for i in range(4):
        assert served(again, f"tok-{i}")
