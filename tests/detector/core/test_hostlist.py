import pytest

from hpcsec.detector.core import hostlist


@pytest.mark.parametrize(
    ("expr", "hosts"),
    [
        ("gpu[001-004,010]", ["gpu001", "gpu002", "gpu003", "gpu004", "gpu010"]),
        ("gpu[001-002],login1", ["gpu001", "gpu002", "login1"]),
        ("n[9-11]", ["n9", "n10", "n11"]),  # no padding: widths differ
        ("n[08-11]", ["n08", "n09", "n10", "n11"]),  # padding from the leading zero
        ("n[10-12]", ["n10", "n11", "n12"]),
        ("n[098-100]", ["n098", "n099", "n100"]),
        ("n[1-3,5]", ["n1", "n2", "n3", "n5"]),
        ("n[7]", ["n7"]),
        ("rack[1-2]-n[01-02]", ["rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"]),
        ("n[1-2]-ib", ["n1-ib", "n2-ib"]),
        (" a , b ", ["a", "b"]),
        ("a,,b,", ["a", "b"]),
        ("vm", ["vm"]),
        ("node-1.cluster", ["node-1.cluster"]),
        ("", []),
        (None, []),
        ("(null)", []),
        ("None", []),
        (["n[1-2]", "m1"], ["n1", "n2", "m1"]),
    ],
)
def test_expand(expr, hosts):
    assert hostlist.expand(expr) == hosts


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("n[1-3", "unbalanced '[' in hostlist 'n[1-3'"),
        ("n1-3]", "unbalanced ']' in hostlist 'n1-3]'"),
        ("n[1-[2]]", "nested '[' in hostlist 'n[1-[2]]'"),
        ("n[]", "bad range '' in hostlist"),
        ("n[a-b]", "bad range 'a-b' in hostlist"),
        ("n[1-2-3]", "bad range '1-2-3' in hostlist"),
        ("n[5-3]", "descending range '5-3' in hostlist"),
        ("n[0-2000000]", "range '0-2000000' is too large"),
        ("n[0-100001]", "range '0-100001' is too large"),
        ("a[0-99999]b[0-99999]", "hostlist 'a[0-99999]b[0-99999]' expands to too many hosts"),
    ],
)
def test_expand_errors(expr, message):
    with pytest.raises(ValueError) as info:
        hostlist.expand(expr)
    assert str(info.value) == message


def test_many_parts_are_capped():
    with pytest.raises(ValueError, match=r"^hostlist expands to too many hosts$"):
        hostlist.expand("a[0-60000],b[0-60000]")


def test_contains():
    assert hostlist.contains("gpu[001-128]", "gpu017")
    assert not hostlist.contains("gpu[001-128]", "gpu17")
    assert not hostlist.contains("gpu[001-128]", "gpu129")
