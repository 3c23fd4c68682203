"""Fuzzing every edge that takes untrusted input.

Two properties, on arbitrary input:

1. Bad input: only `ValidationError` escapes, with a reason, and naming the field whenever
   the input was a mapping (so there is a field to name).
2. Good input: whatever is accepted survives every round trip unchanged (dict, YAML text,
   protobuf, etcd bytes, YAML spec trees) -- and so does every valid spec we generate.
"""

from __future__ import annotations

import string
import urllib.parse
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gazette import names
from gazette.errors import ValidationError
from gazette.keyspace.specs import (
    decode_broker,
    decode_journal,
    decode_shard,
    encode_broker,
    encode_item,
)
from gazette.labels import RESERVED_JOURNAL_LABELS, RESERVED_SHARD_LABELS, LabelSet
from gazette.protocol import (
    CompressionCodec,
    FragmentSpec,
    JournalFlags,
    JournalSpec,
    MemberSpec,
    ProcessId,
    ShardSource,
    ShardSpec,
    Suspend,
    SuspendLevel,
    journal_spec_from_pb,
    journal_spec_to_pb,
    parse_duration,
    shard_spec_from_pb,
    shard_spec_to_pb,
    validate_store_url,
)
from gazette.protocol.durations import MAX_DURATION
from gazette.protocol.fields import INT64_MAX
from gazette.protocol.journal_spec import SINGLE_VALUE_LABELS
from gazette.protocol.member_spec import validate_endpoint
from gazette.protocol.trees import (
    journal_changes_from_yaml,
    shard_changes_from_yaml,
    specs_to_yaml,
)

FUZZ = settings(max_examples=200, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
ROUND_TRIP = settings(max_examples=80, deadline=None,
                      suppress_health_check=[HealthCheck.too_slow])
#: YAML trees go through PyYAML's pure-Python loader, so they get fewer examples.
TREES = settings(max_examples=50, deadline=None,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


def _dump(data: object) -> str:
    """``yaml.safe_dump``, with libyaml when there is one (the loader under test is not)."""
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    return yaml.dump(data, Dumper=dumper)

# --- valid specs survive every edge --------------------------------------------------------

_ALNUM = string.ascii_letters + string.digits
_component = st.text(_ALNUM + "-_+%", min_size=1, max_size=5) | st.builds(
    lambda a, b: f"{a}.{b}", st.text(_ALNUM, min_size=1, max_size=3),
    st.text(_ALNUM, min_size=1, max_size=3))
paths = st.lists(_component, min_size=1, max_size=3).map("/".join)
journal_names = paths.filter(lambda n: len(n) >= 2)
_label_names = st.builds(
    lambda first, mid, last: first + mid + last,
    st.sampled_from(_ALNUM), st.text(_ALNUM + names.LABEL_NAME_SYMBOLS, max_size=5),
    st.sampled_from(_ALNUM),
)
_label_values = st.text(_ALNUM + names.LABEL_VALUE_SYMBOLS, max_size=8)


def _label_sets(reserved: frozenset[str]) -> st.SearchStrategy[LabelSet]:
    return st.lists(
        st.tuples(_label_names.filter(lambda n: n not in reserved | SINGLE_VALUE_LABELS),
                  _label_values),
        max_size=4,
    ).map(LabelSet)


def _durations_between(lo: timedelta, hi: timedelta) -> st.SearchStrategy[timedelta]:
    one = timedelta(microseconds=1)
    return st.integers(lo // one, hi // one).map(lambda us: timedelta(microseconds=us)) | (
        st.sampled_from([lo, hi]))


def _no_dot_segments(path: str) -> bool:
    """Store paths never name '.' or '..', not even percent-encoded (``%2E``): stores
    refuse them, so valid specs must not hold them."""
    return all(urllib.parse.unquote(s) not in (".", "..") for s in path.split("/"))


_store_paths = paths.filter(_no_dot_segments)
_stores = st.lists(
    st.builds(lambda p: f"file:///{p}/", _store_paths) | st.just("file:///")
    | st.builds(lambda b, p, q: f"s3://{b}/{p}/{q}",
                st.sampled_from(["bucket", "my.bucket-1", "b12"]), _store_paths,
                st.sampled_from(["", "?region=us-east-1", "?endpoint=http://m:9000&sse=x"])),
    max_size=3, unique=True,
).map(tuple)

valid_fragments = st.builds(
    FragmentSpec,
    length=st.integers(1 << 10, 16 << 30),
    compression_codec=st.sampled_from(list(CompressionCodec)),
    stores=_stores,
    refresh_interval=_durations_between(timedelta(seconds=1), timedelta(days=1)),
    retention=_durations_between(timedelta(0), MAX_DURATION),
    flush_interval=st.just(timedelta(0))
    | _durations_between(timedelta(seconds=1), MAX_DURATION),
    path_postfix_template=st.sampled_from(["", "date={date}/hour={hour}", "y={year}/m={month}"]),
)
valid_journals = st.builds(
    JournalSpec,
    name=journal_names,
    replication=st.integers(1, 1024),
    labels=_label_sets(RESERVED_JOURNAL_LABELS),
    fragment=valid_fragments,
    flags=st.sampled_from(list(JournalFlags)),
    max_append_rate=st.integers(0, INT64_MAX),
    suspend=st.none() | st.builds(Suspend, st.sampled_from(list(SuspendLevel)),
                                  st.integers(0, INT64_MAX)),
)


@st.composite
def valid_shards(draw: st.DrawFn) -> ShardSpec:
    shard_id = draw(paths)
    journals = draw(st.lists(journal_names, min_size=1, max_size=3, unique=True))
    max_txn = draw(_durations_between(timedelta(milliseconds=1), timedelta(hours=1)))
    recovery: dict[str, Any] = {}
    if draw(st.booleans()):
        recovery = {"recovery_log_prefix": draw(paths),
                    "hint_prefix": "/" + draw(paths),
                    "hint_backups": draw(st.integers(0, 16))}
    return ShardSpec(
        shard_id,
        tuple(ShardSource(j, draw(st.integers(0, INT64_MAX))) for j in journals),
        max_txn_duration=max_txn,
        min_txn_duration=draw(_durations_between(timedelta(0), max_txn)),
        disable=draw(st.booleans()),
        hot_standbys=draw(st.integers(0, 32)),
        labels=draw(_label_sets(RESERVED_SHARD_LABELS)),
        disable_wait_for_ack=draw(st.booleans()),
        ring_buffer_size=draw(st.integers(1, 1 << 24)),
        read_channel_size=draw(st.integers(1, 1 << 24)),
        **recovery,
    )


_tokens = st.text(_ALNUM + "-_.", min_size=1, max_size=8)
valid_members = st.builds(
    MemberSpec,
    id=st.builds(ProcessId, _tokens, _tokens),
    endpoint=st.builds(lambda s, h, p: f"{s}://{h}:{p}", st.sampled_from(["http", "https"]),
                       st.sampled_from(["roland", "10.0.0.1", "[::1]", "a.b-c"]),
                       st.integers(1, 65535)),
    item_limit=st.integers(0, 1 << 20),
)


# --- arbitrary data -----------------------------------------------------------------------

scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.sampled_from([10**400, -(10**400)])  # past float (10**5000: see test_journal_spec)
    | st.floats()
    | st.text(max_size=12)
)
json_like: st.SearchStrategy[Any] = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=12,
)

# Values that are nearly right, so fuzzing gets past the first check of each field.
_names = st.sampled_from(["a/b", "example/journal", "foobar/part-000", "s", "", "a//b", "/a",
                          "a/", "a/../b", "a=b", "x" * 513, "a b"]) | st.text(max_size=10)
_durations = st.sampled_from(["1m0s", "0s", "0", "1s", "500ms", "-1s", "1h", "24h0m1s", "1ms",
                              "2h", "1.5s", "1000000h", "10m"]) | st.floats() | st.integers()
_urls = st.sampled_from(["file:///", "file:///a/", "s3://bucket/p/", "s3://bucket/?region=x",
                         "gs://b/", "file://h/", "file:///a", "s3://B/", "s3://bucket/?x=1"])
_labels = st.lists(
    st.fixed_dictionaries(
        {"name": st.sampled_from(["a", "content-type", "name", "prefix", "id", "x y", "-a"])
         | st.text(max_size=6)},
        optional={"value": st.sampled_from(["", "v", "a/b", "a=b"]) | json_like},
    )
    | json_like,
    max_size=3,
)
_ints = st.integers(min_value=-5, max_value=5000) | st.sampled_from(
    [0, 1, 1024, 1 << 24, INT64_MAX, INT64_MAX + 1, 16 << 30, (16 << 30) + 1]) | json_like


def _plausible(fields: Mapping[str, st.SearchStrategy[Any]]) -> st.SearchStrategy[Any]:
    """Dicts with any of `fields` (nearly right or arbitrary values), maybe an unknown key."""
    values = {k: v | json_like for k, v in fields.items()}
    return st.fixed_dictionaries({}, optional=values).flatmap(
        lambda d: st.one_of(
            st.just(d),
            st.dictionaries(st.sampled_from(["bogus", "revision", ""]), json_like,
                            max_size=1).map(
                lambda extra: {**d, **extra}),
        )
    )


def _mutated(valid: st.SearchStrategy[Any],
             fields: Mapping[str, st.SearchStrategy[Any]]) -> st.SearchStrategy[Any]:
    """The dict form of a valid spec with up to three fields dropped, set to nearly right or
    arbitrary values, or added (unknown keys): each fault lands deep in a valid whole."""
    keys = [*sorted(fields), "bogus", "revision", ""]

    @st.composite
    def build(draw: st.DrawFn) -> dict[str, Any]:
        out: dict[str, Any] = draw(valid).to_dict()
        for _ in range(draw(st.integers(0, 3))):
            key = draw(st.sampled_from(keys))
            if draw(st.integers(0, 4)) == 0:
                out.pop(key, None)
            else:
                out[key] = draw(fields.get(key, json_like) | json_like)
        return out

    return build()


_fragment_fields: dict[str, st.SearchStrategy[Any]] = {
    "length": _ints, "compression_codec": st.sampled_from(["SNAPPY", "gzip", "LZ4", "NONE"]),
    "stores": st.lists(_urls, max_size=3), "refresh_interval": _durations,
    "retention": _durations, "flush_interval": _durations,
    "path_postfix_template": st.sampled_from(["date={date}", "{x}", "{date}/", "a b", ""]),
}
fragments = _mutated(valid_fragments, _fragment_fields) | _plausible(_fragment_fields)
_journal_fields: dict[str, st.SearchStrategy[Any]] = {
    "name": _names, "replication": _ints, "labels": _labels, "fragment": fragments,
    "flags": st.sampled_from(["O_RDONLY", ["O_RDONLY", "O_WRONLY"], 3, 8, "X", 4]),
    "max_append_rate": _ints,
    "suspend": _plausible({"level": st.sampled_from(["NONE", "partial", "HALF"]),
                           "offset": _ints}),
}
journal_dicts = _mutated(valid_journals, _journal_fields) | _plausible(_journal_fields)
_shard_fields: dict[str, st.SearchStrategy[Any]] = {
    "id": _names,
    "sources": st.lists(_plausible({"journal": _names, "min_offset": _ints}), max_size=3),
    "recovery_log_prefix": st.sampled_from(["logs", "/logs", "a//b", ""]),
    "hint_prefix": st.sampled_from(["/hints", "hints", "/a/", ""]),
    "hint_backups": _ints, "max_txn_duration": _durations, "min_txn_duration": _durations,
    "disable": st.booleans(), "hot_standbys": _ints, "labels": _labels,
    "disable_wait_for_ack": st.booleans(), "ring_buffer_size": _ints,
    "read_channel_size": _ints,
}
shard_dicts = _mutated(valid_shards(), _shard_fields) | _plausible(_shard_fields)
_member_fields: dict[str, st.SearchStrategy[Any]] = {
    "zone": st.sampled_from(["local", "us-east-1", "", "a b", "a#b"]),
    "suffix": st.sampled_from(["busy-walrus", "", "a:b"]),
    "endpoint": st.sampled_from(["http://h:8080", "h:1", "http://h", "https://[::1]:1",
                                 "http://h:0", "http://u@h:1"]),
    "item_limit": _ints,
}
member_dicts = _mutated(valid_members, _member_fields) | _plausible(_member_fields)


def _is_plain_mapping(data: object) -> bool:
    return isinstance(data, dict) and all(isinstance(k, str) for k in data)


def _check(fn: Callable[[Any], Any], data: object, needs_field: bool) -> Any:
    """``fn(data)``: its result, or None after checking the ValidationError it raised."""
    try:
        return fn(data)
    except ValidationError as err:
        assert err.reason, repr(err)
        if needs_field:
            assert err.field, repr(err)
        return None


def _check_spec(from_dict: Callable[[Any], Any], data: object) -> Any:
    """`_check` of a spec's ``from_dict``; what it accepts must round-trip."""
    spec = _check(from_dict, data, _is_plain_mapping(data))
    if spec is not None:
        assert from_dict(spec.to_dict()) == spec
        assert from_dict(yaml.safe_load(_dump(spec.to_dict()))) == spec
    return spec


@FUZZ
@given(json_like | journal_dicts)
def test_journal_from_dict(data: object) -> None:
    spec = _check_spec(JournalSpec.from_dict, data)
    if spec is not None:
        assert journal_spec_from_pb(journal_spec_to_pb(spec)) == spec


@FUZZ
@given(json_like | fragments)
def test_fragment_from_dict(data: object) -> None:
    _check_spec(FragmentSpec.from_dict, data)


@FUZZ
@given(json_like | shard_dicts)
def test_shard_from_dict(data: object) -> None:
    spec = _check_spec(ShardSpec.from_dict, data)
    if spec is not None:
        assert shard_spec_from_pb(shard_spec_to_pb(spec)) == spec


@FUZZ
@given(json_like | member_dicts)
def test_member_from_dict(data: object) -> None:
    _check_spec(MemberSpec.from_dict, data)


@FUZZ
@given(json_like)
def test_small_parts_from_dict(data: object) -> None:
    _check(Suspend.from_dict, data, _is_plain_mapping(data))
    _check(lambda d: ShardSource.from_dict(d, "sources[0]"), data, True)
    _check(lambda d: CompressionCodec.parse(d, "codec"), data, True)
    _check(lambda d: JournalFlags.parse(d, "flags"), data, True)
    _check(lambda d: LabelSet.from_list(d), data, True)


# --- YAML trees -------------------------------------------------------------------------

_tree_names = st.sampled_from(["foobar/", "foobar/part-000", "foobar/part-001", "a/", "a/b",
                               "", "a//", "s/1", "s/"]) | st.text(max_size=6)
_leaf_fields = {
    "replication": _ints, "fragment": fragments, "labels": _labels, "revision": _ints,
    "delete": st.booleans(), "flags": st.just("O_RDONLY"),
    "sources": st.lists(_plausible({"journal": _names}), max_size=2),
    "hint_prefix": st.just("/h"), "recovery_log_prefix": st.just("logs"),
}
_leaves = st.fixed_dictionaries({"name": _tree_names, "id": _tree_names},
                                optional=_leaf_fields)
#: Tree-shaped junk: groups, children and fields in odd places.
junk_trees: st.SearchStrategy[Any] = st.recursive(
    _leaves | json_like,
    lambda kids: st.fixed_dictionaries(
        {"name": _tree_names, "id": _tree_names, "children": st.lists(kids, max_size=3)},
        optional=_leaf_fields),
    max_leaves=6,
)


def _spec_trees(kind: str) -> st.SearchStrategy[Any]:
    """Well-formed trees: a group of (mutated) specs named under its prefix, with some of
    their fields moved onto the group, plus ``revision`` or ``delete`` here and there."""
    key, leaves = ("name", journal_dicts) if kind == "journals" else ("id", shard_dicts)

    @st.composite
    def build(draw: st.DrawFn) -> dict[str, Any]:
        prefix = draw(paths) + "/"
        children = []
        for i, leaf in enumerate(draw(st.lists(leaves, min_size=1, max_size=3))):
            leaf = dict(leaf)
            if draw(st.integers(0, 5)):
                leaf[key] = f"{prefix}part-{i}"
            leaf.update(draw(st.fixed_dictionaries(
                {}, optional={"revision": st.integers(0, 9) | json_like,
                              "delete": st.booleans() | json_like})))
            children.append(leaf)
        group = {k: v for k, v in children[0].items() if k not in (key, "revision")
                 and draw(st.booleans())}
        return {**group, key: prefix, "children": children}

    return build()


_LOADERS = [journal_changes_from_yaml, shard_changes_from_yaml]


def _check_tree(load: Callable[[str], Any], text: str) -> None:
    try:
        changes = load(text)
    except ValidationError as err:
        assert err.reason, repr(err)
        return
    for change in changes:
        assert isinstance(change.name, str) and change.revision >= 0
    # Accepted specs come back through YAML unchanged.
    upserts = sorted((c.name, c.revision, c.spec) for c in changes if c.spec is not None)
    if upserts:
        again = load(specs_to_yaml([(spec, rev) for _, rev, spec in upserts]))
        assert [(c.name, c.revision, c.spec) for c in again] == upserts


@FUZZ
@given(st.sampled_from(_LOADERS), st.text(max_size=80))
def test_trees_from_random_text(load: Callable[[str], Any], text: str) -> None:
    _check_tree(load, text)


@FUZZ
@given(st.sampled_from(_LOADERS),
       st.text(alphabet="abc/:-[]{},#&*!|>'\"\n %@`?01.", max_size=60))
def test_trees_from_yaml_like_text(load: Callable[[str], Any], text: str) -> None:
    _check_tree(load, text)


@TREES
@given(st.sampled_from(_LOADERS), junk_trees | st.lists(junk_trees, max_size=3) | json_like)
def test_trees_from_dumped_junk(load: Callable[[str], Any], data: object) -> None:
    _check_tree(load, _dump(data))


@TREES
@given(_spec_trees("journals"))
def test_journal_trees_from_dumped_specs(tree: dict[str, Any]) -> None:
    _check_tree(journal_changes_from_yaml, _dump(tree))


@TREES
@given(_spec_trees("shards"))
def test_shard_trees_from_dumped_specs(tree: dict[str, Any]) -> None:
    _check_tree(shard_changes_from_yaml, _dump(tree))


# --- scalar validators ------------------------------------------------------------------

_NAME_VALIDATORS: list[Callable[[object, str], str]] = [
    names.validate_journal_name,
    names.validate_shard_id,
    names.validate_label_name,
    names.validate_label_value,
    names.validate_prefix,
    names.validate_etcd_prefix,
    lambda v, f: names.validate_path(v, f, 1, 64),
    lambda v, f: names.validate_token(v, f, "-_", 1, 64),
]
_name_like = st.text(alphabet=string.ascii_letters[:3] + "/.=-_%#: \t", max_size=12)


@FUZZ
@given(st.sampled_from(_NAME_VALIDATORS), _name_like | st.text(max_size=20) | json_like)
def test_name_validators(validate: Callable[[object, str], str], value: object) -> None:
    try:
        assert validate(value, "the.field") == value
    except ValidationError as err:
        assert err.field == "the.field" and err.reason


@FUZZ
@given(_durations | st.text(alphabet="0123456789.hmsuµ+- ", max_size=10) | json_like
       | st.timedeltas())
def test_parse_duration(value: object) -> None:
    try:
        result = parse_duration(value, "max_txn_duration")
    except ValidationError as err:
        assert err.field == "max_txn_duration" and err.reason
    else:
        assert timedelta(0) <= result <= MAX_DURATION


_url_like = st.builds(
    lambda scheme, host, path, query: f"{scheme}{host}{path}{query}",
    st.sampled_from(["file://", "s3://", "S3://", "gs://", "file:", ""]),
    st.sampled_from(["", "bucket", "my.bucket-1", "B", "u@b", "b:1", "[x"]),
    st.text(alphabet="ab/.%2e\n #", max_size=10),
    st.sampled_from(["", "?", "?region=x", "?region=x&region=y", "?foo", "#f"]),
)


@FUZZ
@given(_url_like | st.text(max_size=30) | json_like)
def test_validate_store_url(value: object) -> None:
    try:
        assert validate_store_url(value, "fragment.stores[0]") == value
    except ValidationError as err:
        assert err.field == "fragment.stores[0]" and err.reason
    else:
        assert isinstance(value, str)
        FragmentSpec(stores=(value,))  # an accepted URL is a valid store


@FUZZ
@given(st.builds(lambda s, h, p: f"{s}{h}{p}",
                 st.sampled_from(["http://", "https://", "HTTP://", "http:", ""]),
                 st.text(alphabet="ab.:[]1@ \n", max_size=8),
                 st.sampled_from(["", ":80", ":0", ":99999", ":80/", ":x", "/p"]))
       | st.text(max_size=20) | json_like)
def test_validate_endpoint(value: object) -> None:
    try:
        assert validate_endpoint(value, "endpoint") == value
    except ValidationError as err:
        assert err.field == "endpoint" and err.reason


@ROUND_TRIP
@given(valid_journals)
def test_valid_journals_round_trip(spec: JournalSpec) -> None:
    assert JournalSpec.from_dict(spec.to_dict()) == spec
    assert JournalSpec.from_dict(yaml.safe_load(_dump(spec.to_dict()))) == spec
    assert journal_spec_from_pb(journal_spec_to_pb(spec)) == spec
    assert decode_journal(encode_item(spec)) == spec


@ROUND_TRIP
@given(valid_shards())
def test_valid_shards_round_trip(spec: ShardSpec) -> None:
    assert ShardSpec.from_dict(spec.to_dict()) == spec
    assert ShardSpec.from_dict(yaml.safe_load(_dump(spec.to_dict()))) == spec
    assert shard_spec_from_pb(shard_spec_to_pb(spec)) == spec
    assert decode_shard(encode_item(spec)) == spec


@ROUND_TRIP
@given(valid_members)
def test_valid_members_round_trip(spec: MemberSpec) -> None:
    assert MemberSpec.from_dict(spec.to_dict()) == spec
    assert decode_broker(encode_broker(spec)) == spec


@TREES
@given(st.lists(st.tuples(valid_journals, st.integers(0, 2**40)), max_size=4,
                unique_by=lambda pair: pair[0].name))
def test_valid_journal_trees_round_trip(pairs: list[tuple[JournalSpec, int]]) -> None:
    back = journal_changes_from_yaml(specs_to_yaml(pairs))
    assert [(c.name, c.revision, c.spec) for c in back] == sorted(
        ((s.name, rev, s) for s, rev in pairs), key=lambda t: t[0])


@TREES
@given(st.lists(st.tuples(valid_shards(), st.integers(0, 2**40)), max_size=4,
                unique_by=lambda pair: pair[0].id))
def test_valid_shard_trees_round_trip(pairs: list[tuple[ShardSpec, int]]) -> None:
    back = shard_changes_from_yaml(specs_to_yaml(pairs))
    assert [(c.name, c.revision, c.spec) for c in back] == sorted(
        ((s.id, rev, s) for s, rev in pairs), key=lambda t: t[0])
