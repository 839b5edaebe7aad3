"""MIG geometry: products, placement rules, maximal layouts, best placement.

The oracle here is written from docs/mig-geometry.md independently of
``autoscaler/mig`` (a plain table and a brute force over every subset of
placements), so the enumeration is checked against the definition, not
against itself.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from autoscaler.cli import app
from autoscaler.mig import (
    PRODUCTS,
    LayoutError,
    Placement,
    best_start,
    check_layout,
    free_starts,
    get_product,
    is_maximal,
    maximal_layouts,
    parse_layout,
)

SEVEN_SLICE = ["A100-SXM4-40GB", "A100-SXM4-80GB", "H100-SXM5-80GB", "H100-NVL-94GB", "H200-141GB"]

# docs/mig-geometry.md, typed in again: kind -> (compute slices, memory slots, allowed starts)
GEOMETRY_7 = {
    "1g": (1, 1, range(7)),
    "1g+me": (1, 1, range(7)),
    "1g.dbl": (1, 2, (0, 2, 4, 6)),
    "2g": (2, 2, (0, 2, 4)),
    "3g": (3, 4, (0, 4)),
    "4g": (4, 4, (0,)),
    "7g": (7, 8, (0,)),
}
GEOMETRY_A30 = {"1g": (1, 1, range(4)), "2g": (2, 2, (0, 2)), "4g": (4, 4, (0,))}
NAMES = {  # docs/mig-geometry.md profile-name table
    "A100-SXM4-40GB": "1g.5gb 1g.5gb+me 1g.10gb 2g.10gb 3g.20gb 4g.20gb 7g.40gb",
    "A100-SXM4-80GB": "1g.10gb 1g.10gb+me 1g.20gb 2g.20gb 3g.40gb 4g.40gb 7g.80gb",
    "H100-SXM5-80GB": "1g.10gb 1g.10gb+me 1g.20gb 2g.20gb 3g.40gb 4g.40gb 7g.80gb",
    "H100-NVL-94GB": "1g.12gb 1g.12gb+me 1g.24gb 2g.24gb 3g.47gb 4g.47gb 7g.94gb",
    "H200-141GB": "1g.18gb 1g.18gb+me 1g.35gb 2g.35gb 3g.71gb 4g.71gb 7g.141gb",
}
KINDS_ORDER = ["1g", "1g+me", "1g.dbl", "2g", "3g", "4g", "7g"]


def oracle_kind(product: str, profile: str) -> str:
    if product == "A30-24GB":
        return {"1g.6gb": "1g", "2g.12gb": "2g", "4g.24gb": "4g"}[profile]
    return dict(zip(NAMES[product].split(), KINDS_ORDER))[profile]


def oracle_valid(product: str, layout: Sequence[Placement]) -> bool:
    geo = GEOMETRY_A30 if product == "A30-24GB" else GEOMETRY_7
    total = 4 if product == "A30-24GB" else 7
    used: set[int] = set()
    compute = me = 0
    for pl in layout:
        if pl.profile not in PRODUCTS[product].profiles:
            return False
        kind = oracle_kind(product, pl.profile)
        c, slots, starts = geo[kind]
        if pl.start not in starts:
            return False
        span = set(range(pl.start, pl.start + slots))
        if span & used:
            return False
        used |= span
        compute += c
        me += kind == "1g+me"
    return compute <= total and me <= 1


def standard_placements(product: str) -> list[Placement]:
    prod = get_product(product)
    out = []
    for p in prod.standard_profiles():
        out += [Placement(s, p.name) for s in p.starts]
    return out


def brute_force_maximal(product: str) -> set[tuple[Placement, ...]]:
    """Every valid subset of standard placements to which none can be added."""
    cands = standard_placements(product)
    valid = []
    for r in range(len(cands) + 1):
        for combo in itertools.combinations(cands, r):
            if oracle_valid(product, combo):
                valid.append(frozenset(combo))
    valid_set = set(valid)
    return {tuple(sorted(v)) for v in valid if not any(v | {c} in valid_set for c in cands if c not in v)}


# ---------------------------------------------------------------- products


@pytest.mark.parametrize("product", SEVEN_SLICE)
def test_profile_names_and_geometry_match_facts(product: str) -> None:
    prod = get_product(product)
    assert list(prod.profiles) == NAMES[product].split()
    assert (prod.compute_slices, prod.mem_slots) == (7, 8)
    for p in prod.profiles.values():
        c, slots, starts = GEOMETRY_7[p.kind]
        assert (p.compute, p.mem_slots, tuple(p.starts)) == (c, slots, tuple(starts)), p


def test_a30_geometry() -> None:
    prod = get_product("A30-24GB")
    assert (prod.compute_slices, prod.mem_slots) == (4, 4)
    assert {n: (p.compute, p.mem_slots, tuple(p.starts)) for n, p in prod.profiles.items()} == {
        "1g.6gb": (1, 1, (0, 1, 2, 3)),
        "2g.12gb": (2, 2, (0, 2)),
        "4g.24gb": (4, 4, (0,)),
    }


def test_nvml_profile_indices() -> None:
    prod = get_product("A100-SXM4-80GB")
    assert {p.kind: p.nvml_index for p in prod.profiles.values()} == {
        "1g": 0,
        "2g": 1,
        "3g": 2,
        "4g": 3,
        "7g": 4,
        "1g+me": 7,
        "1g.dbl": 9,
    }


def test_unknown_product_names_known_ones() -> None:
    with pytest.raises(KeyError, match="A100-SXM4-80GB"):
        get_product("B200")


# ---------------------------------------------------------------- maximal layouts


@pytest.mark.parametrize("product", SEVEN_SLICE)
def test_19_maximal_layouts_14_mixes(product: str) -> None:
    found = maximal_layouts(get_product(product))
    assert len(found) == 19
    assert len(set(found)) == 19
    assert len({tuple(sorted(pl.profile for pl in lay)) for lay in found}) == 14


@pytest.mark.parametrize("product", [*SEVEN_SLICE, "A30-24GB"])
def test_enumeration_equals_brute_force(product: str) -> None:
    assert set(maximal_layouts(get_product(product))) == brute_force_maximal(product)


def test_a30_layouts() -> None:
    found = {tuple(str(p) for p in lay) for lay in maximal_layouts(get_product("A30-24GB"))}
    assert found == {
        ("4g.24gb@0",),
        ("2g.12gb@0", "2g.12gb@2"),
        ("2g.12gb@0", "1g.6gb@2", "1g.6gb@3"),
        ("1g.6gb@0", "1g.6gb@1", "2g.12gb@2"),
        ("1g.6gb@0", "1g.6gb@1", "1g.6gb@2", "1g.6gb@3"),
    }


def test_known_a100_layouts_are_in_the_enumeration() -> None:
    found = set(maximal_layouts(get_product("A100-SXM4-80GB")))
    for text in [
        "7g.80gb@0",
        "4g.40gb@0,3g.40gb@4",
        "3g.40gb@0,3g.40gb@4",
        "2g.20gb@0,2g.20gb@2,2g.20gb@4,1g.10gb@6",
        ",".join(f"1g.10gb@{i}" for i in range(7)),
    ]:
        assert parse_layout(text) in found, text
    # 4g + 2g + 1g is NOT maximal-free: 4g@0 + 2g@4 leaves room for 1g@6
    assert parse_layout("4g.40gb@0,2g.20gb@4") not in found


# ---------------------------------------------------------------- placement rules


@pytest.mark.parametrize(
    ("product", "text", "fragment"),
    [
        ("A100-SXM4-80GB", "3g.40gb@2", "may start only at slots [0, 4]"),
        ("A100-SXM4-80GB", "4g.40gb@0,3g.40gb@0", "overlaps"),
        ("A100-SXM4-80GB", "2g.20gb@2,1g.10gb@3", "overlaps 2g.20gb@2 at memory slot 3"),
        ("A100-SXM4-80GB", "1g.10gb+me@0,1g.10gb+me@1", "at most one per GPU"),
        ("A100-SXM4-80GB", "1g.5gb@0", "not valid for A100-SXM4-80GB"),
        ("A100-SXM4-80GB", "7g.80gb@0,1g.10gb@3", "uses 8 compute slices"),
        ("A100-SXM4-80GB", "1g.20gb@1", "may start only at slots [0, 2, 4, 6]"),
        ("A30-24GB", "2g.12gb@1", "may start only at slots [0, 2]"),
        ("A30-24GB", "4g.24gb@0,1g.6gb@3", "uses 5 compute slices, A30-24GB has 4"),
        ("H200-141GB", "3g.40gb@0", "not valid for H200-141GB"),
    ],
)
def test_check_layout_reasons(product: str, text: str, fragment: str) -> None:
    problems = check_layout(get_product(product), parse_layout(text))
    assert any(fragment in p for p in problems), problems


def test_valid_layouts_with_variants() -> None:
    prod = get_product("A100-SXM4-80GB")
    assert check_layout(prod, parse_layout("1g.10gb+me@0,1g.20gb@2,2g.20gb@4,1g.10gb@6")) == []
    assert check_layout(prod, parse_layout("4g.40gb@0,3g.40gb@4")) == []
    assert check_layout(prod, ()) == []


@pytest.mark.parametrize("text", ["3g.40gb", "@4", "3g.40gb@x", "3g.40gb@-1"])
def test_parse_layout_rejects_bad_syntax(text: str) -> None:
    with pytest.raises(LayoutError):
        parse_layout(text)


def test_free_starts() -> None:
    prod = get_product("A100-SXM4-80GB")
    assert free_starts(prod, parse_layout("3g.40gb@0"), "2g.20gb") == [4]
    assert free_starts(prod, parse_layout("3g.40gb@0"), "3g.40gb") == [4]
    assert free_starts(prod, parse_layout("3g.40gb@4"), "4g.40gb") == [0]
    assert free_starts(prod, parse_layout("4g.40gb@0,2g.20gb@4"), "1g.10gb") == [6]
    assert free_starts(prod, parse_layout("1g.10gb+me@6"), "1g.10gb+me") == []
    # 3g@0 + 3g@4 fill all 8 memory slots with 6 compute slices: nothing fits
    assert free_starts(prod, parse_layout("3g.40gb@0,3g.40gb@4"), "1g.10gb") == []


# ---------------------------------------------------------------- property tests

ALL_PRODUCTS = [*SEVEN_SLICE, "A30-24GB"]


@st.composite
def any_placements(draw, product: str | None = None):
    """Random placements of ANY profile of the product (variants too), at any start 0..7."""
    product = product or draw(st.sampled_from(ALL_PRODUCTS))
    names = list(PRODUCTS[product].profiles) + ["3g.40gb", "1g.5gb"]  # and some foreign names
    items = draw(st.lists(st.tuples(st.sampled_from(names), st.integers(0, 7)), max_size=6))
    return product, tuple(sorted(Placement(s, n) for n, s in items))


@st.composite
def valid_standard_partial(draw):
    """A valid layout built by adding random standard placements that fit."""
    product = draw(st.sampled_from(ALL_PRODUCTS))
    prod = get_product(product)
    layout: tuple[Placement, ...] = ()
    for _ in range(draw(st.integers(0, 5))):
        options = [(p.name, s) for p in prod.standard_profiles() for s in free_starts(prod, layout, p.name)]
        if not options:
            break
        name, s = draw(st.sampled_from(options))
        layout = tuple(sorted((*layout, Placement(s, name))))
    return product, layout


@settings(max_examples=300, deadline=None)
@given(any_placements())
def test_check_layout_agrees_with_oracle(case) -> None:
    product, layout = case
    assert (check_layout(get_product(product), layout) == []) == oracle_valid(product, layout)


@pytest.mark.parametrize("product", ALL_PRODUCTS)
def test_every_enumerated_layout_is_valid_and_maximal(product: str) -> None:
    prod = get_product(product)
    for lay in maximal_layouts(prod):
        assert check_layout(prod, lay) == [] and oracle_valid(product, lay)
        assert is_maximal(prod, lay)
        # maximal by the definition: adding any standard placement breaks validity
        assert not any(oracle_valid(product, (*lay, c)) for c in standard_placements(product) if c not in lay)


@settings(max_examples=200, deadline=None)
@given(valid_standard_partial())
def test_every_valid_partial_layout_extends_to_an_enumerated_one(case) -> None:
    product, layout = case
    prod = get_product(product)
    assert check_layout(prod, layout) == []
    assert any(set(layout) <= set(m) for m in maximal_layouts(prod))
    assert is_maximal(prod, layout) == (layout in maximal_layouts(prod))


@settings(max_examples=200, deadline=None)
@given(valid_standard_partial(), st.data())
def test_best_start_keeps_the_most_options(case, data) -> None:
    product, layout = case
    prod = get_product(product)
    profile = data.draw(st.sampled_from([p.name for p in prod.standard_profiles()]))
    starts = free_starts(prod, layout, profile)
    best = best_start(prod, layout, profile)
    if not starts:
        assert best is None
        return
    assert best in starts

    def options(s: int) -> int:
        grown = set(layout) | {Placement(s, profile)}
        return sum(1 for m in brute_force_maximal_cached(product) if grown <= set(m))

    assert options(best) == max(options(s) for s in starts)
    assert options(best) >= 1  # a valid placement always lies in some maximal layout
    assert check_layout(prod, (*layout, Placement(best, profile))) == []


_BF: dict[str, set] = {}


def brute_force_maximal_cached(product: str) -> set:
    if product not in _BF:
        _BF[product] = brute_force_maximal(product)
    return _BF[product]


def test_best_start_prefers_the_top_for_small_instances() -> None:
    """On an empty A100 a 1g at slot 6 keeps 4g@0 and 3g@0 possible; at slot 0 it would rule both out."""
    prod = get_product("A100-SXM4-80GB")
    assert best_start(prod, (), "1g.10gb") == 6
    assert best_start(prod, (), "3g.40gb") == 4  # leaves slot 0 for a 4g
    assert best_start(prod, parse_layout("3g.40gb@0,3g.40gb@4"), "1g.10gb") is None


# ---------------------------------------------------------------- the `layouts` command

runner = CliRunner()


@pytest.mark.parametrize("product", ALL_PRODUCTS)
def test_layouts_json_is_the_enumeration(product: str) -> None:
    res = runner.invoke(app, ["layouts", product, "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert all(set(item) == {"profile", "start"} for lay in data for item in lay)
    got = {tuple(sorted(Placement(i["start"], i["profile"]) for i in lay)) for lay in data}
    assert got == set(maximal_layouts(get_product(product)))


def test_layouts_table_lists_19() -> None:
    res = runner.invoke(app, ["layouts", "H100-SXM5-80GB"])
    assert res.exit_code == 0
    assert "19 maximal layouts" in res.stdout


@pytest.mark.parametrize("product", ["A100-SXM4-80GB", "A30-24GB"])
def test_check_accepts_every_enumerated_layout(product: str) -> None:
    for lay in maximal_layouts(get_product(product)):
        res = runner.invoke(app, ["layouts", product, "--check", ",".join(map(str, lay))])
        assert res.exit_code == 0, res.output
        assert "(maximal)" in res.stdout


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(any_placements(product="A100-SXM4-80GB"))
def test_check_agrees_with_check_layout(case) -> None:
    product, layout = case
    res = runner.invoke(app, ["layouts", product, "--check", ",".join(map(str, layout)), "--json"])
    problems = check_layout(get_product(product), layout)
    assert res.exit_code == (1 if problems else 0)
    out = json.loads(res.stdout)
    assert out["valid"] == (not problems) and out["problems"] == problems
    prod = get_product(product)
    assert out["maximal"] == (not problems and is_maximal(prod, layout))
    standard = {p.name for p in prod.standard_profiles()}
    if all(pl.profile in standard for pl in layout):  # for standard kinds: maximal == enumerated
        assert out["maximal"] == (layout in maximal_layouts(prod))


def test_check_reports_reason_and_exit_codes() -> None:
    res = runner.invoke(app, ["layouts", "A100-SXM4-80GB", "--check", "3g.40gb@0,4g.40gb@0"])
    assert res.exit_code == 1 and "overlaps" in res.stderr
    res = runner.invoke(app, ["layouts", "A100-SXM4-80GB", "--check", "3g.40gb@0"])
    assert res.exit_code == 0 and "room for" in res.stdout  # valid but not maximal
    res = runner.invoke(app, ["layouts", "A100-SXM4-80GB", "--check", "3g.40gb"])
    assert res.exit_code == 2 and "expected PROFILE@START" in res.stderr


def test_unknown_product_exits_2_naming_valid_ones() -> None:
    res = runner.invoke(app, ["layouts", "B200"])
    assert res.exit_code == 2
    assert "'B200'" in res.stderr and all(p in res.stderr for p in PRODUCTS)
    assert "Traceback" not in res.output
