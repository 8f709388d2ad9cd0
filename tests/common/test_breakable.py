"""common.breakable: break points after an identifier's separators, and nothing else."""
from common.breakable import breakable


def test_a_break_point_after_each_separator_but_the_last_character():
    assert breakable("!room:server.example") == "!room:<wbr>server.<wbr>example"
    assert breakable("check_topological_ordering") == "check_<wbr>topological_<wbr>ordering"
    assert breakable("a/b:") == "a/<wbr>b:"
    assert breakable("worker1") == "worker1"


def test_text_is_escaped_before_break_points_go_in():
    assert breakable('<b>"x"</b>:y') == "&lt;b&gt;&quot;x&quot;&lt;/<wbr>b&gt;:<wbr>y"
    assert breakable(1005) == "1005"
