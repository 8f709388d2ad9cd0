"""The observer's pure core (synapse_attach/observer.py), by value, with a fake clock: lines as
Synapse writes them on its Redis channel."""
from __future__ import annotations

from synapse_attach.observer import MAX_TRACKED, StuckWriter, SynapseObserver


def feed(observer: SynapseObserver, now: float, *lines: str) -> None:
    for line in lines:
        observer.observe_line(line, now)


def test_positions_advances_and_facts_per_writer():
    o = SynapseObserver(started=0.0)
    feed(o, 1.0, 'RDATA events master batch ["ev",["$a","!r","m.room.message",null,null,null,null,false,false]]',
         'RDATA events master 5 ["ev",["$b","!r","m.room.message",null,null,null,null,false,false]]',
         "POSITION events persister1 3 4")
    feed(o, 2.0, "POSITION events master 5 5")  # no advance
    feed(o, 3.0, 'RDATA receipts master 7 ["!r","m.read","@u",["$b"],null,{}]')
    view = o.as_dict(4.0)
    events = view["streams"]["events"]
    assert events["highest"] == 5
    assert events["writers"] == [
        {"instance": "master", "position": 5, "written": 5, "advanced_seconds_ago": 3.0, "facts": 2,
         "facts_per_second": 0.67, "behind_seconds": None, "stuck": False},
        {"instance": "persister1", "position": 4, "written": None, "advanced_seconds_ago": 3.0, "facts": 0,
         "facts_per_second": 0.0, "behind_seconds": 3.0, "stuck": False},
    ]
    assert view["streams"]["receipts"]["writers"][0]["position"] == 7
    assert view["instances"] == [
        {"instance": "master", "last_seen_seconds_ago": 1.0, "commands": {"POSITION": 1, "RDATA": 3}},
        {"instance": "persister1", "last_seen_seconds_ago": 3.0, "commands": {"POSITION": 1}},
    ]
    assert view["lines"] == 5 and view["bad_lines"] == 0


def test_facts_per_second_over_the_window():
    o = SynapseObserver()
    for second in range(10):
        for _ in range(4):
            feed(o, float(second), 'RDATA to_device master batch ["@u","d"]')
    writer = o.writers[("to_device", "master")]
    assert writer.facts == 40
    assert writer.facts_per_second(10.0) == 4.0


def test_every_command_kind_is_a_sign_of_life():
    o = SynapseObserver()
    feed(o, 1.0, "USER_SYNC run1 @u:hs DEV start 1700000000000",
         "FEDERATION_ACK fed1 12",
         'LOCK_RELEASED ["w1","lock","key"]',
         'USER_IP @u:hs ["tok","1.2.3.4","UA",null,1700000000000]',
         "REMOTE_SERVER_UP matrix.org",
         "REPLICATE ",
         "NOT_A_COMMAND x", "RDATA events master notanumber []", "")
    view = o.as_dict(2.0)
    assert {i["instance"]: i["commands"] for i in view["instances"]} == {
        "run1": {"USER_SYNC": 1}, "fed1": {"FEDERATION_ACK": 1}, "w1": {"LOCK_RELEASED": 1}}
    assert view["unattributed"] == {"REMOTE_SERVER_UP": 1, "REPLICATE": 1, "USER_IP": 1}
    assert view["bad_lines"] == 2 and view["lines"] == 9


def test_a_writer_left_behind_is_stuck_after_the_threshold_and_named_with_how_long():
    o = SynapseObserver(stuck_after=10.0)
    feed(o, 0.0, "POSITION events master 10 10", "POSITION events persister1 10 10")
    feed(o, 1.0, "POSITION events master 10 12")  # persister1 behind from here
    for t in range(2, 11):
        feed(o, float(t), f"POSITION events master {10 + t} {11 + t}")
    assert o.stuck(10.9) == []
    assert o.stuck(11.0) == [StuckWriter("events", "persister1", 10, 21, 10.0)]
    assert o.as_dict(15.0)["stuck"] == [{"stream": "events", "instance": "persister1", "position": 10,
                                         "highest": 21, "behind_seconds": 14.0}]
    # It comes back: writes above the others, no longer behind.
    feed(o, 16.0, "POSITION events persister1 10 22")
    assert o.stuck(16.0) == []
    # ...and now the other one is behind, until it echoes.
    assert o.writers[("events", "master")].behind_since == 16.0
    feed(o, 16.5, "POSITION events master 21 22")
    assert o.stuck(100.0) == []


def test_a_writer_that_advances_but_stays_below_restarts_its_clock():
    o = SynapseObserver(stuck_after=10.0)
    feed(o, 0.0, "POSITION events master 0 5", "POSITION events persister1 0 4")
    for t in range(1, 30):
        feed(o, float(t), f"POSITION events master 0 {10 * t + 5}",
             f"POSITION events persister1 0 {10 * t}")  # always behind, always moving
    assert o.stuck(30.0) == []
    assert o.writers[("events", "persister1")].behind_since == 29.0


def test_an_idle_writer_that_echoes_the_others_is_never_stuck():
    """Synapse's idle writer moves its position up to what the others handed out and says so
    with a POSITION within about a second."""
    o = SynapseObserver(stuck_after=10.0)
    for t in range(0, 60):
        feed(o, float(t), f"RDATA events master {100 + t} [\"ev\",[]]")
        feed(o, t + 0.9, f"POSITION events persister1 {99 + t} {100 + t}")
    assert o.stuck(60.0) == []


def test_a_single_writer_and_the_caches_stream_are_never_stuck():
    o = SynapseObserver(stuck_after=1.0)
    feed(o, 0.0, "POSITION receipts master 1 1", "POSITION caches persister1 3 3")
    for t in range(1, 20):
        feed(o, float(t), f"POSITION caches master 3 {3 + t}")
    assert o.stuck(100.0) == []


def test_a_new_stream_name_or_instance_beyond_the_bound_is_counted_not_kept():
    o = SynapseObserver()
    for i in range(MAX_TRACKED + 5):
        feed(o, 0.0, f"FEDERATION_ACK w{i} 1")
    assert len(o.instances) == MAX_TRACKED and o.untracked == 5


def test_a_read_of_many_lines_is_the_same_as_line_by_line():
    """observe_lines takes RDATA in runs (the replication worker's fast path): the same figures
    as one line at a time, POSITIONs between runs in their place."""
    lines = ['RDATA events master batch ["ev",[]]', 'RDATA events master 5 ["ev",[]]',
             'RDATA events persister1 6 ["ev",[]]', "POSITION events master 5 6",
             'RDATA caches master batch ["c",[]]', 'RDATA caches master batch ["c",[]]',
             "USER_SYNC run1 @u:hs DEV start 1", "garbage", 'RDATA events persister1 x []', ""]
    one_by_one, at_once = SynapseObserver(), SynapseObserver()
    feed(one_by_one, 1.0, *lines)
    at_once.observe_lines(lines, 1.0)
    assert at_once.as_dict(2.0) == one_by_one.as_dict(2.0)
    view = at_once.as_dict(2.0)
    assert view["bad_lines"] == 2 and view["lines"] == 10
    assert view["streams"]["caches"]["writers"][0]["position"] is None  # batch only: no token yet
    assert view["streams"]["caches"]["writers"][0]["facts"] == 2
    assert view["streams"]["events"]["highest"] == 6
