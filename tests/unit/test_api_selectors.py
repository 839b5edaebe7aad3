"""Label selector strings as the HPA sends them (labels.Parse grammar)."""

import pytest

from autoscaler.api.selectors import SelectorError, parse_selector

LABELS = {
    "app.kubernetes.io/name": "triton",
    "migscale.io/model": "resnet",
    "migscale.io/profile": "1g.10gb",
    "migscale.io/deployment": "resnet-1g-10gb",
    "index": "3",
}


@pytest.mark.parametrize(
    "text, matches",
    [
        ("", True),
        ("migscale.io/deployment=resnet-1g-10gb", True),
        ("migscale.io/deployment==resnet-1g-10gb", True),
        ("migscale.io/deployment=bert-3g-40gb", False),
        ("migscale.io/model!=bert", True),
        ("migscale.io/model!=resnet", False),
        ("missing!=x", True),  # != matches an absent label, as in Kubernetes
        ("migscale.io/model in (bert, resnet)", True),
        ("migscale.io/model in (bert)", False),
        ("migscale.io/model notin (bert)", True),
        ("migscale.io/model notin (resnet,bert)", False),
        ("app.kubernetes.io/name", True),
        ("!app.kubernetes.io/name", False),
        ("!missing", True),
        ("missing", False),
        ("index>2", True),
        ("index<3", False),
        ("app.kubernetes.io/name=triton, migscale.io/profile in (1g.10gb,2g.20gb)", True),
        ("app.kubernetes.io/name=triton,migscale.io/model=bert", False),
        ("migscale.io/profile=", False),  # empty value is a valid value; no label has it
    ],
)
def test_match(text, matches):
    assert parse_selector(text).matches(LABELS) is matches


@pytest.mark.parametrize(
    "bad",
    [
        "a in (",
        "a in b",
        "a in ()",
        "a=b=c",
        ",",
        "a=b,",
        "a b",
        "-a=b",
        "a=-b",
        "a>x",
        "a in ((b))",
        "a)",
        "Bad_Prefix.io/x=y",
        "x" * 64 + "=y",
        "a=" + "v" * 64,
        "=b",
        "!",
    ],
)
def test_malformed_raises(bad):
    with pytest.raises(SelectorError):
        parse_selector(bad)


def test_equalities_feed_the_index():
    sel = parse_selector("migscale.io/deployment=x,migscale.io/model in (a),b notin (c)")
    assert sel.equalities() == {"migscale.io/deployment": "x", "migscale.io/model": "a"}


def test_round_trip_string():
    text = "a=b,c!=d,e in (f,g),h notin (i),j,!k,l>3"
    assert str(parse_selector(str(parse_selector(text)))) == str(parse_selector(text))
