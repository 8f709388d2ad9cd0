"""Caps on the state peers create at the endpoint (streams/replication/peer_state.py)."""
from streams.replication.commands import parse_line
from streams.replication.peer_state import RecentUserIps, SyncingUsers, SyncingUsersBudget


def sync(instance, user, device, state):
    return parse_line(f"USER_SYNC {instance} {user} {device} {state} 1")


def test_syncing_users_per_connection_and_in_all():
    budget = SyncingUsersBudget(limit=5)
    a, b = SyncingUsers(budget, per_connection=3), SyncingUsers(budget, per_connection=3)
    assert all(a.apply(sync("i1", f"@u{n}:hs", "D", "start")) for n in range(3))
    assert a.apply(sync("i1", "@u0:hs", "D", "start"))  # already there: no new entry
    assert not a.apply(sync("i2", "@u9:hs", "D", "start"))  # over this connection's cap
    assert a.count == 3 and a.dropped == 1 and budget.used == 3
    assert b.apply(sync("j", "@v0:hs", "None", "start")) and b.apply(sync("j", "@v1:hs", "None", "start"))
    assert not b.apply(sync("j", "@v2:hs", "None", "start"))  # over the total
    assert budget.used == 5 and budget.dropped == 2
    assert b.by_instance == {"j": {("@v0:hs", None), ("@v1:hs", None)}}
    # Ends and clears give room back; an end of an unknown pair changes nothing.
    assert a.apply(sync("i1", "@u0:hs", "D", "end")) and a.apply(sync("i1", "@nobody:hs", "D", "end"))
    assert budget.used == 4 and b.apply(sync("j", "@v2:hs", "None", "start"))
    a.clear("i1")
    assert a.count == 0 and a.by_instance == {} and budget.used == 3
    b.release()  # the connection went
    assert budget.used == 0 and b.by_instance == {}


def test_syncing_users_fill_the_snapshot_dict_they_are_given():
    shown: dict = {}
    users = SyncingUsers(SyncingUsersBudget(10), 10, shown)
    users.apply(sync("i1", "@u:hs", "None", "start"))
    assert shown == {"i1": {("@u:hs", None)}}


def test_user_ips_keep_the_most_recent_users():
    ips = RecentUserIps(limit=3)
    for n in range(5):
        ips.add(parse_line(f'USER_IP @u{n}:hs ["tok","1.2.3.{n}","UA",null,{n}]'))
    assert list(ips.entries) == ["@u2:hs", "@u3:hs", "@u4:hs"] and ips.evicted == 2
    ips.add(parse_line('USER_IP @u2:hs ["tok","9.9.9.9","UA",null,9]'))  # seen again: most recent
    ips.add(parse_line('USER_IP @u5:hs ["tok","1.1.1.1","UA",null,10]'))
    assert list(ips.entries) == ["@u4:hs", "@u2:hs", "@u5:hs"] and ips["@u2:hs"].ip == "9.9.9.9"
    assert len(ips) == 3 and "@u3:hs" not in ips
