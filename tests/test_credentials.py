"""Credentials like munge's (issued, verified, refused in munge's words) and key files like munged's."""
import os
import pwd

import pytest

from rota.core import credentials as c
from rota.wire import keys

pytestmark = pytest.mark.fast    # make test-fast: the core and the front door, no process started

CLUSTER = b"k" * 64
T = 1_800_000_000


def key_of(host):
    return c.host_key(CLUSTER, host)


def issue(**kw):
    args = dict(key=key_of("login1"), kind="req", uid=1001, gid=1001, host="login1", issued=T, nonce="ab" * 16,
                subject="rota.api.submit r1", payload=b'{"spec":{}}')
    args.update(kw)
    return c.issue(**args)


def verify(text, now=T + 1, payload=b'{"spec":{}}', subject="rota.api.submit r1", kind="req", replay=None, **kw):
    return c.verify(key_of, text, subject, payload, now, kind=kind, replay=replay, **kw)


def test_a_credential_proves_who_on_which_host_asked_for_exactly_this():
    cred = verify(issue())
    assert (cred.uid, cred.gid, cred.host, cred.kind) == (1001, 1001, "login1", "req")


@pytest.mark.parametrize("change", [
    {"payload": b'{"spec":{"nice":-10}}'},        # another body
    {"subject": "rota.api.cancel r1"},            # another verb
    {"subject": "rota.api.submit r2"},            # another request id
])
def test_anything_changed_is_an_invalid_credential(change):
    with pytest.raises(c.CredentialError) as e:
        verify(issue(), **change)
    assert e.value.words == "Invalid credential"


def test_forged_fields_and_other_keys_are_invalid():
    text = issue()
    forged = text.replace(":1001:1001:", ":0:0:")             # claiming root
    for bad in (forged, issue(key=key_of("gpu01")),             # signed with another host's key
                issue(key=c.host_key(b"x" * 64, "login1"))):     # another cluster's
        with pytest.raises(c.CredentialError) as e:
            verify(bad)
        assert e.value.words == "Invalid credential"


def test_munges_time_window_and_replay():
    with pytest.raises(c.CredentialError) as e:
        verify(issue(), now=T + 301)
    assert e.value.words == "Expired credential"
    with pytest.raises(c.CredentialError) as e:
        verify(issue(), now=T - 301)
    assert e.value.words == "Rewound credential" and "out of sync clocks" in str(e.value)
    verify(issue(), now=T - 299)                               # within the skew a TTL allows
    with pytest.raises(c.CredentialError):
        verify(issue(), now=T + 61, max_ttl=60)                 # AuthInfo=ttl=60 caps what a signer claims
    replay = c.ReplayCache()
    verify(issue(), replay=replay)
    with pytest.raises(c.CredentialError) as e:
        verify(issue(), replay=replay)
    assert e.value.words == "Replayed credential"
    verify(issue(nonce="cd" * 16), replay=replay)              # a new credential is fine
    replay.insert(c.parse(issue(nonce="ef" * 16, issued=T)), T + 10_000)   # long expired ones are forgotten
    assert len(replay) == 1


@pytest.mark.parametrize("text", [None, "", "garbage", "rota1:req:1:1:h:1:300:abababababababab", "rota2" + "x" * 90,
                                  "rota1:req:x:1:login1:1:300:abababababababab:" + "0" * 64,
                                  "rota1:req:1:1:bad host:1:300:abababababababab:" + "0" * 64, "x" * 10_000])
def test_malformed_credentials_are_refused_not_crashed_on(text):
    with pytest.raises(c.CredentialError) as e:
        verify(text)
    assert e.value.words == "Invalid credential format"


def test_kind_and_unknown_host():
    with pytest.raises(c.CredentialError, match="a node credential where a req one is needed"):
        verify(issue(kind="node"))
    with pytest.raises(c.CredentialError, match="unknown host"):
        c.verify(lambda h: None, issue(), "rota.api.submit r1", b'{"spec":{}}', T, kind="req")


def test_the_log_mac_binds_position_stamp_actor_and_body():
    mac = c.log_mac(CLUSTER, 7, T, "alice(1001)@login1", "1001:r", b"{}")
    assert c.check_log_mac(CLUSTER, mac, 7, T, "alice(1001)@login1", "1001:r", b"{}")
    for args in ((8, T, "alice(1001)@login1", "1001:r", b"{}"), (7, T + 1, "alice(1001)@login1", "1001:r", b"{}"),
                 (7, T, "root(0)", "1001:r", b"{}"), (7, T, "alice(1001)@login1", "1001:r", b"[]")):
        assert not c.check_log_mac(CLUSTER, mac, *args)
    assert not c.check_log_mac(CLUSTER, None, 7, T, "a", "", b"{}")


# ---------------------------------------------------------------- key files


def test_keygen_writes_a_private_key_and_loading_checks_it(tmp_path):
    path = str(tmp_path / "cluster.key")
    keys.generate(path)
    assert os.stat(path).st_mode & 0o777 == 0o600 and len(open(path, "rb").read()) == 128
    assert keys.load_keyring(path).cluster_key == open(path, "rb").read()
    with pytest.raises(FileExistsError):
        keys.generate(path)                                    # never overwritten by accident
    os.chmod(path, 0o640)
    with pytest.raises(keys.KeyFileError) as e:
        keys.load_cluster_key(path)
    assert "should not be readable or writable by group or others (perms=0640)" in e.value.message
    assert e.value.fix == f"chmod 600 {path}"


@pytest.mark.skipif(os.geteuid() != 0, reason="changing a file's owner needs root")
def test_a_key_owned_by_someone_else_is_refused_with_the_fix(tmp_path):
    path = str(tmp_path / "cluster.key")
    keys.generate(path)
    nobody = pwd.getpwnam("nobody")
    os.chown(path, nobody.pw_uid, nobody.pw_gid)
    with pytest.raises(keys.KeyFileError) as e:
        keys.load_cluster_key(path)
    assert f"should be owned by UID 0 instead of UID {nobody.pw_uid}" in e.value.message
    assert e.value.fix == f"chown root {path}"


def test_missing_short_and_linked_keys_are_refused(tmp_path):
    with pytest.raises(keys.KeyFileError, match="Failed to find keyfile"):
        keys.load_cluster_key(str(tmp_path / "none"))
    short = tmp_path / "short.key"
    keys.write_private(str(short), b"x" * 8)
    with pytest.raises(keys.KeyFileError, match="holds 8 bytes"):
        keys.load_cluster_key(str(short))
    real = tmp_path / "real.key"
    keys.generate(str(real))
    link = tmp_path / "link.key"
    link.symlink_to(real)
    with pytest.raises(keys.KeyFileError, match="regular file"):
        keys.load_cluster_key(str(link))


def test_a_host_key_vouches_for_its_host_only(tmp_path):
    cluster = tmp_path / "cluster.key"
    keys.generate(str(cluster))
    ring = keys.load_keyring(str(cluster))
    host = tmp_path / "gpu01.key"
    keys.write_host_key(str(host), ring.cluster_key, "gpu01")
    node = keys.load_keyring(str(host), "gpu01")
    assert node.key_of("gpu01") == ring.key_of("gpu01") and node.key_of("gpu02") is None
    assert node.cluster_key is None and node.purpose_key("log") is None
    with pytest.raises(keys.KeyFileError, match="is the key of host gpu01, not of gpu02"):
        keys.load_keyring(str(host), "gpu02")
