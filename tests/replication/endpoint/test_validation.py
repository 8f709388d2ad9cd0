"""What the endpoint accepts from a peer beyond the grammar (replication/endpoint/validation.py)."""
import pytest

from replication.endpoint.validation import (
    MAX_USER_AGENT_LENGTH,
    check_inbound,
    text_problem,
    user_id_problem,
)
from replication.protocol.commands import RemoteProtocolError, UserIpCommand, parse_line


@pytest.mark.parametrize("user_id", [
    "@alice:example.com", "@a:hs", "@_bridge.bot=1/x:matrix.org:8448", "@u:[::1]", "@u:[::1]:8448",
    "@u:127.0.0.1", "@Ab+9!~:hs",  # historical localparts
    "@" + "a" * 248 + ":hs.io",  # 255 bytes
])
def test_matrix_user_ids_pass(user_id):
    assert user_id_problem(user_id) is None


@pytest.mark.parametrize("user_id, problem", [
    ("@" + "a" * 16384 + ":hs", "longer than 255 bytes"),
    ("@" + "a" * 249 + ":hs.io", "longer than 255 bytes"),
    ("alice:hs", "not a Matrix user ID"),
    ("@alice", "not a Matrix user ID"),
    ("@:hs", "not a Matrix user ID"),
    ("@a\x00b:hs", "not a Matrix user ID"),
    ("@a b:hs", "not a Matrix user ID"),
    ("@é:hs", "not a Matrix user ID"),
    ("@a:h_s", "not a Matrix user ID"),
    ("@a:hs:port", "not a Matrix user ID"),
])
def test_other_user_ids_are_refused(user_id, problem):
    assert problem in user_id_problem(user_id)


def test_labels_must_be_printable_and_short():
    assert text_problem("synapse.app.generic_worker") is None
    assert text_problem("worker 1") is None  # spaces are printable
    assert "control" in text_problem("a\x00b")
    assert "control" in text_problem("a\x1b[31m")
    assert "control" in text_problem("a\u2028b")  # a line separator
    assert "longer" in text_problem("x" * 256)
    assert text_problem("") == "empty"


@pytest.mark.parametrize("line, error", [
    ("NAME a\x00b", "invalid NAME: name 'a\\x00b': contains control"),
    ("NAME " + "n" * 300, "invalid NAME: name 'nnnn"),
    ("USER_SYNC abcde @u:hs DEV\x07 start 1", "invalid USER_SYNC: device ID"),
    ("USER_SYNC abcde " + "@" + "u" * 16000 + ":hs None start 1", "invalid USER_SYNC: user ID"),
    ("CLEAR_USER_SYNC a\x00", "invalid CLEAR_USER_SYNC: instance ID"),
    ('USER_IP @' + "u" * 16000 + ':hs ["tok","1.2.3.4","UA",null,1]', "invalid USER_IP: user ID"),
    ('USER_IP @u:hs ["tok","1.2.3.4\\u0000","UA",null,1]', "invalid USER_IP: IP"),
    ('USER_IP @u:hs ["' + "t" * 2000 + '","1.2.3.4","UA",null,1]', "invalid USER_IP: access token"),
    ('USER_IP @u:hs ["tok","1.2.3.4","UA\\n",null,1]', "invalid USER_IP: user agent"),
    ("FEDERATION_ACK fed1 99999999999999999999999", "invalid FEDERATION_ACK: token"),
    ("FEDERATION_ACK fed\x01 1", "invalid FEDERATION_ACK: instance name"),
    ("REMOTE_SERVER_UP " + "s" * 300, "invalid REMOTE_SERVER_UP: server name"),
    ('LOCK_RELEASED ["w1","lock\\u0000",""]', "invalid LOCK_RELEASED: lock name"),
])
def test_bad_values_are_refused_with_their_field(line, error):
    with pytest.raises(RemoteProtocolError) as e:
        check_inbound(parse_line(line))
    assert e.value.error_text.startswith(error), e.value.error_text
    assert len(e.value.error_text) < 200  # the value is quoted shortened


@pytest.mark.parametrize("line", [
    "NAME synapse.app.generic_worker", "USER_SYNC abcde @u:hs None start 1700000000000",
    "USER_SYNC abcde @u:hs DEVICEID end 1", "CLEAR_USER_SYNC abcde", "FEDERATION_ACK fed1 12",
    'USER_IP @u:hs ["syt_abc","::ffff:10.0.0.1","Mozilla/5.0 (X11)",null,1700000000000]',
    'USER_IP @u:hs ["tok","1.2.3.4","",  "DEV",1]', "REMOTE_SERVER_UP matrix.org:8448",
    'LOCK_RELEASED ["w1","lock",""]', "PING 1", "REPLICATE ", "ERROR anything \x01 goes (logged)",
])
def test_what_synapse_sends_passes_unchanged(line):
    cmd = parse_line(line)
    assert check_inbound(cmd) is cmd


def test_a_long_user_agent_is_cut_not_refused():
    cmd = parse_line('USER_IP @u:hs ["tok","1.2.3.4","' + "A" * 5000 + '",null,1]')
    kept = check_inbound(cmd)
    assert isinstance(kept, UserIpCommand) and kept.user_agent == "A" * MAX_USER_AGENT_LENGTH
    assert (kept.user_id, kept.ip, kept.last_seen) == ("@u:hs", "1.2.3.4", 1)
