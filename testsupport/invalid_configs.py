"""One valid Ignition 3.3 config (GOOD) and the ways to break it (BAD_CASES: name -> (mutation,
the error our validation must give)): tests/render/test_spec.py checks our validation's
messages, tests/render/test_ignition_tools.py that the real `ignition-validate` refuses them too."""

from __future__ import annotations

import copy

SHA512 = "sha512-" + "ab" * 64

GOOD = {
    "ignition": {"version": "3.3.0"},
    "storage": {
        "files": [{"path": "/etc/a", "mode": 0o644,
                   "contents": {"source": "https://h.example/a", "verification": {"hash": SHA512},
                                "httpHeaders": [{"name": "X", "value": "1"}]}}],
        "directories": [{"path": "/etc/d", "mode": 0o755}],
        "links": [{"path": "/etc/l", "target": "/etc/a"}],
    },
    "systemd": {"units": [{"name": "a.service", "dropins": [{"name": "10-x.conf"}]}]},
    "passwd": {"users": [{"name": "core", "sshAuthorizedKeys": ["k1"]}], "groups": [{"name": "g"}]},
    "kernelArguments": {"shouldExist": ["a"], "shouldNotExist": ["b"]},
}


def bad(mutate) -> dict:
    """A copy of GOOD with `mutate` applied."""
    c = copy.deepcopy(GOOD)
    mutate(c)
    return c


def _set(path, value):
    def mutate(c):
        *parents, last = path
        node = c
        for p in parents:
            node = node[p]
        node[last] = value
    return mutate


F = ("storage", "files", 0)
BAD_CASES = {
    "wrong type": (_set(F + ("mode",), "0644"), r"storage\.files\[0\]\.mode: '0644' is not of type"),
    "unknown key": (_set(("storage", "filez"), []), r"storage\.filez: unknown key"),
    "unknown nested key": (_set(F + ("contents", "sorce"), "x"), r"storage\.files\[0\]\.contents\.sorce: unknown key"),
    "version mismatch": (_set(("ignition", "version"), "3.3"), r"ignition\.version: is '3\.3', expected exactly"),
    "hash malformed": (_set(F + ("contents", "verification", "hash"), "sha512abc"),
                       r"storage\.files\[0\]\.contents\.verification\.hash: malformed hash"),
    "hash short": (_set(F + ("contents", "verification", "hash"), "sha512-abcd"),
                   r"verification\.hash: sha512 digest must be 128 hex"),
    "hash function": (_set(F + ("contents", "verification", "hash"), "md5-" + "a" * 32),
                      r"verification\.hash: unrecognized hash function 'md5'"),
    "scheme": (_set(F + ("contents", "source"), "ftp://h/a"), r"contents\.source: invalid url scheme 'ftp'"),
    "gs below 3.2": (lambda c: (_set(F + ("contents", "source"), "gs://b/o")(c),
                                _set(("ignition", "version"), "3.1.0")(c),
                                c.pop("kernelArguments"), c["storage"].pop("links")),
                     r"contents\.source: gs:// sources need spec 3\.2\.0"),
    "headers on data": (lambda c: c["storage"]["files"][0]["contents"].update(source="data:,x"),
                        r"contents\.httpHeaders: HTTP headers need an http or https source"),
    "duplicate header": (_set(F + ("contents", "httpHeaders"), [{"name": "X", "value": "1"}, {"name": "X", "value": "2"}]),
                         r"httpHeaders\[1\]: duplicate HTTP header 'X'"),
    "duplicate file": (lambda c: c["storage"]["files"].append({"path": "/etc/a"}),
                       r"storage\.files\[1\]\.path: duplicate entry '/etc/a'"),
    "file and directory": (lambda c: c["storage"]["directories"].append({"path": "/etc/a"}),
                           r"storage\.directories\[1\]\.path: '/etc/a' is both in storage\.files and storage\.directories"),
    "file and link": (lambda c: c["storage"]["links"].append({"path": "/etc/a", "target": "/x"}),
                      r"storage\.links\[1\]\.path: '/etc/a' is both"),
    "below a link": (lambda c: c["storage"]["files"].append({"path": "/etc/l/x"}),
                     r"storage\.files\[1\]\.path: '/etc/l/x' is below '/etc/l', which is a link"),
    "relative path": (_set(F + ("path",), "etc/a"), r"storage\.files\[0\]\.path: path 'etc/a' is not absolute"),
    "unclean path": (_set(F + ("path",), "/etc//a/"), r"storage\.files\[0\]\.path: path '/etc//a/' is not fully simplified"),
    "mode range": (_set(F + ("mode",), 0o10000), r"storage\.files\[0\]\.mode: illegal mode 4096"),
    "negative mode": (_set(F + ("mode",), -1), r"storage\.files\[0\]\.mode: illegal mode -1"),
    "special bits below 3.6": (_set(F + ("mode",), 0o4755), r"storage\.files\[0\]\.mode: setuid/setgid/sticky bits need spec 3\.6\.0"),
    "unit suffix": (_set(("systemd", "units", 0, "name"), "a.foo"), r"systemd\.units\[0\]\.name: invalid unit name 'a\.foo'"),
    "dropin suffix": (_set(("systemd", "units", 0, "dropins", 0, "name"), "x.txt"),
                      r"dropins\[0\]\.name: invalid dropin name 'x\.txt'"),
    "duplicate unit": (lambda c: c["systemd"]["units"].append({"name": "a.service"}),
                       r"systemd\.units\[1\]: duplicate unit 'a\.service'"),
    "duplicate dropin": (lambda c: c["systemd"]["units"][0]["dropins"].append({"name": "10-x.conf"}),
                         r"systemd\.units\[0\]\.dropins\[1\]: duplicate dropin '10-x\.conf'"),
    "duplicate user": (lambda c: c["passwd"]["users"].append({"name": "core"}), r"passwd\.users\[1\]: duplicate user 'core'"),
    "duplicate group": (lambda c: c["passwd"]["groups"].append({"name": "g"}), r"passwd\.groups\[1\]: duplicate group 'g'"),
    "duplicate ssh key": (_set(("passwd", "users", 0, "sshAuthorizedKeys"), ["k1", "k1"]),
                          r"sshAuthorizedKeys\[1\]: duplicate SSH key"),
    "duplicate karg": (_set(("kernelArguments", "shouldExist"), ["a", "a"]), r"kernelArguments\.shouldExist\[1\]: duplicate"),
    "karg both ways": (_set(("kernelArguments", "shouldNotExist"), ["a"]),
                       r"kernelArguments\.shouldNotExist\[0\]: kernel argument 'a' is also in shouldExist"),
    "compression": (_set(F + ("contents", "compression"), "xz"), r"contents\.compression: invalid compression method 'xz'"),
    "verification without source": (lambda c: c["storage"]["files"][0]["contents"].pop("source") and
                                    c["storage"]["files"][0]["contents"].pop("httpHeaders"),
                                    r"verification\.hash: a source is needed"),
    "id and name": (_set(F + ("user",), {"id": 0, "name": "root"}), r"storage\.files\[0\]\.user: cannot set both id and name"),
}
