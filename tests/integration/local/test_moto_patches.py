"""local/moto_server's moto patches: the moto version they were written for, and the same answers as moto's own.

`indexed_moto_queries` answers Query from a partition or an index bucket instead of a sort of the whole table;
every query here runs twice on the same data, patched and through `unpatched_queries()` (moto's own code), and
the pages must be identical: items and their order, Count, ScannedCount, LastEvaluatedKey.
"""

from __future__ import annotations

import copy
import itertools
import json
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rollout_pipeline.ledger import keys
from rollout_pipeline.ledger.schema import create_table_kwargs
from rollout_pipeline.local import moto_server
from rollout_pipeline.local.moto_server import PATCHED_MOTO_VERSION, patch_moto, unpatched_queries

ROOT = Path(__file__).resolve().parents[3]
_tables = itertools.count()

PKS = ("B#a", "B#b", "LIMIT")
SKS = ("BATCH", "G#1", "G#2", "R#1#0", "R#1#1", "R#2#0", "R#3#0")
DL = st.one_of(st.none(), st.sampled_from(("DL#0", "DL#1")))
OB = st.one_of(st.none(), st.just("OB#0"))
EPOCH = st.one_of(st.none(), st.integers(0, 4))
KEY = st.tuples(st.sampled_from(PKS), st.sampled_from(SKS))


@pytest.fixture
def ddb(aws_env: None) -> Iterator[Any]:
    from moto import mock_aws

    patch_moto()
    with mock_aws():
        yield boto3.client("dynamodb", region_name="us-east-1")


def new_table(ddb: Any) -> str:
    name = f"ledger-{next(_tables)}"
    ddb.create_table(**create_table_kwargs(name))
    return name


# ------------------------------------------------------------------------------------------- the moto version


def test_moto_is_the_release_the_patches_were_written_for() -> None:
    """Upgrading moto (constraints.txt, pyproject) must fail here until the patches are re-read against it."""
    import moto

    pins = {
        path.name: re.findall(r"moto(?:\[server\])?==([\w.]+)", (ROOT / path).read_text())
        for path in (Path("constraints.txt"), Path("pyproject.toml"))
    }
    assert moto.__version__ == PATCHED_MOTO_VERSION
    assert pins["constraints.txt"] == [PATCHED_MOTO_VERSION]
    assert set(pins["pyproject.toml"]) == {PATCHED_MOTO_VERSION}
    from moto.dynamodb.models import DynamoDBBackend
    from moto.dynamodb.models.table import Table

    patch_moto()
    for method in (Table.query, Table.put_item, Table.delete_item, DynamoDBBackend.update_item):
        assert getattr(method, "rollouts_patched", False), method
    assert getattr(DynamoDBBackend.transact_write_items, "rollouts_patched", False)
    from moto.sqs.models import SQSBackend

    for name in ("receive_message", "is_message_valid_based_on_retention_period", *moto_server._SQS_OPERATIONS):
        assert getattr(getattr(SQSBackend, name), "rollouts_patched", False), name
    from moto.sqs.models import Queue

    for name in ("messages", "approximate_number_of_messages_delayed", "approximate_number_of_messages_not_visible"):
        assert getattr(getattr(Queue, name).fget, "rollouts_patched", False), name
    import jsonpath_ng.ext

    assert getattr(jsonpath_ng.ext.parse, "rollouts_patched", False)
    from moto.core.serialize import BaseJSONSerializer

    assert getattr(BaseJSONSerializer.get_value, "rollouts_patched", False)
    from moto.dynamodb.parsing import expressions, validators

    for patched in (validators.DepthFirstTraverser.process, expressions.UpdateExpressionParser.make):
        assert getattr(patched, "rollouts_patched", False), patched
    assert getattr(validators.deepcopy, "rollouts_patched", False)


def test_another_moto_release_is_left_unpatched_with_a_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    import moto

    monkeypatch.setattr(moto, "__version__", "99.0.0")
    assert not moto_server.moto_patchable()
    with pytest.warns(RuntimeWarning, match="found moto 99.0.0; moto left unpatched"):
        assert moto_server._refuse_other_moto("indexed_moto_queries")


# ------------------------------------------------------------------------------------- SQS receives, atomic


@pytest.fixture
def sqs(aws_env: None) -> Iterator[Any]:
    from moto import mock_aws

    patch_moto()
    with mock_aws():
        yield boto3.client("sqs", region_name="us-east-1")


def test_two_concurrent_receives_never_get_one_message_both(sqs: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """moto checks a message's visibility, then marks it received: two receives between those steps both got it
    (a local consumer ran a dispatch twice). Marking is slowed here so that, unpatched, the second receive comes
    between them every time."""
    from moto.sqs.models import Message

    url = sqs.create_queue(QueueName="atomic")["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="once")
    mark = Message.mark_received

    def slow_mark(self: Any, visibility_timeout: int | None = None) -> None:
        time.sleep(0.2)
        mark(self, visibility_timeout)

    monkeypatch.setattr(Message, "mark_received", slow_mark)
    got: list[str] = []
    receivers = [
        threading.Thread(
            target=lambda: got.extend(m["Body"] for m in sqs.receive_message(QueueUrl=url).get("Messages", []))
        )
        for _ in range(2)
    ]
    for receiver in receivers:
        receiver.start()
    for receiver in receivers:
        receiver.join(timeout=30)
    assert got == ["once"]


def test_a_long_poll_does_not_hold_back_the_send_it_waits_for(sqs: Any) -> None:
    """A receive's wait is spent outside the lock: the message sent during it reaches it (held behind the long
    poll, the send would land only once the receive had returned empty)."""
    url = sqs.create_queue(QueueName="long-poll")["QueueUrl"]
    got: list[Any] = []
    receiver = threading.Thread(target=lambda: got.append(sqs.receive_message(QueueUrl=url, WaitTimeSeconds=10)))
    receiver.start()
    time.sleep(0.3)  # the receive is waiting (if it is not yet, it finds the message at once: the test holds)
    sqs.send_message(QueueUrl=url, MessageBody="awaited")
    receiver.join(timeout=30)
    assert [m["Body"] for m in got[0].get("Messages", [])] == ["awaited"]


def test_a_send_or_a_receive_scans_the_queue_once_and_keeps_its_answers(
    sqs: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """moto computed every attribute of a queue (scans of all its messages, asking the time twice for each) for every
    message a send took and every message a receive returned: 0.8 s of CPU for a receive of 10 from a queue of 1,000
    warm offers, under the lock every SQS request takes. Patched, a request asks the time at most once per scan and
    the answers stay moto's: the counts, what is visible, and no expired message returned."""
    from moto.core import utils

    url = sqs.create_queue(QueueName="deep", Attributes={"MessageRetentionPeriod": "60"})["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="later", DelaySeconds=60)
    batch = [{"Id": str(i), "MessageBody": f"m{i}"} for i in range(10)]
    for _ in range(30):
        sqs.send_message_batch(QueueUrl=url, Entries=batch)
    time_reads = itertools.count()
    unix_time = utils.unix_time
    monkeypatch.setattr(utils, "unix_time", lambda dt=None: (next(time_reads), unix_time(dt))[1])
    sqs.send_message_batch(QueueUrl=url, Entries=batch)
    assert next(time_reads) < 100, "a send of 10 to a queue of 300: no scan of the queue per message sent"
    time_reads = itertools.count()
    assert len(sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=30)["Messages"]) == 10
    assert next(time_reads) < 100, "a receive of 10 from a queue of 310: one scan, not three per message returned"
    counts = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert (counts["ApproximateNumberOfMessages"], counts["ApproximateNumberOfMessagesNotVisible"]) == ("300", "10")
    assert counts["ApproximateNumberOfMessagesDelayed"] == "1"
    later = unix_time() + 120
    monkeypatch.setattr(utils, "unix_time", lambda _dt=None: later)  # 2 min on: past the queue's 60 s retention
    assert sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get("Messages", []) == []


# ------------------------------------------------------------------------------- EventBridge targets, parsed once


def test_events_reach_their_targets_as_moto_renders_them_with_no_parser_built_per_event(
    aws_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """moto renders each event it sends to a target through an input template (its default one without an
    `InputTransformer`): 8 JSONPaths, each parsed by a new parser that builds its grammar tables (a fifth of local
    mode's CPU during a batch). Patched, a path is parsed once per process and the messages stay moto's."""
    from jsonpath_ng.ext.parser import ExtendedJsonPathParser
    from moto import mock_aws

    patch_moto()
    parsers = itertools.count()
    build = ExtendedJsonPathParser.__init__

    def counted(self: Any, *args: Any, **kwargs: Any) -> None:
        next(parsers)
        build(self, *args, **kwargs)

    monkeypatch.setattr(ExtendedJsonPathParser, "__init__", counted)
    with mock_aws():
        events = boto3.client("events", region_name="us-east-1")
        sqs = boto3.client("sqs", region_name="us-east-1")
        urls = [sqs.create_queue(QueueName=name)["QueueUrl"] for name in ("plain", "shaped")]
        arns = [
            sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
            for url in urls
        ]
        events.put_rule(Name="all", EventPattern=json.dumps({"source": ["test"]}))
        shaped = {"InputPathsMap": {"n": "$.detail.n"}, "InputTemplate": '{"n": <n>}'}
        events.put_targets(
            Rule="all",
            Targets=[{"Id": "plain", "Arn": arns[0]}, {"Id": "shaped", "Arn": arns[1], "InputTransformer": shaped}],
        )

        def send(n: int) -> list[Any]:
            events.put_events(Entries=[{"Source": "test", "DetailType": "t", "Detail": json.dumps({"n": n})}])
            return [json.loads(sqs.receive_message(QueueUrl=url)["Messages"][0]["Body"]) for url in urls]

        first = send(1)
        built = next(parsers)
        later = [send(n) for n in range(2, 5)]
        assert next(parsers) == built + 1, "no parser built for the events after the first"
    assert (first[0]["detail"], first[0]["source"], first[0]["detail-type"]) == ({"n": 1}, "test", "t")
    assert first[1] == {"n": 1}
    assert [(plain["detail"], shaped) for plain, shaped in later] == [({"n": n}, {"n": n}) for n in range(2, 5)]


def test_the_server_finds_a_hosts_backend_as_moto_does_once_per_host(monkeypatch: pytest.MonkeyPatch) -> None:
    """moto's server finds each request's backend by listing its own package's folders and matching its URL
    patterns (0.7 ms of CPU a request, under a lock every request takes); `backend_dispatcher` does it once a host."""
    from moto import backends
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app

    services = ("dynamodb", "sqs", "events", "s3", "sts", "cloudformation", "bedrock-agentcore")
    hosts = [*(f"{service}.us-east-1.amazonaws.com" for service in services), "127.0.0.1", "moto_api", None]
    theirs = DomainDispatcherApplication(create_backend_app)
    expected = [theirs.get_backend_for_host(host) for host in hosts]
    ours = moto_server.backend_dispatcher()
    listings = itertools.count()
    listing = backends.list_of_moto_modules
    monkeypatch.setattr(backends, "list_of_moto_modules", lambda: (next(listings), listing())[1])
    assert [ours.get_backend_for_host(host) for host in hosts] == expected
    listed = next(listings)
    assert [ours.get_backend_for_host(host) for host in hosts * 3] == expected * 3
    assert next(listings) == listed + 1, "no listing of moto's folders for a host already seen"


# --------------------------------------------------------------------- DynamoDB answers, serialized as moto's


SCALAR = st.one_of(
    st.builds(lambda t: {"S": t}, st.text(max_size=5)),
    st.builds(lambda n: {"N": str(n)}, st.integers()),
    st.builds(lambda b: {"B": b}, st.binary(max_size=4)),
    st.builds(lambda b: {"BOOL": b}, st.booleans()),
    st.just({"NULL": True}),
    st.builds(lambda t: {"SS": t}, st.lists(st.text(max_size=3), max_size=3, unique=True)),
    st.builds(lambda n: {"NS": [str(i) for i in n]}, st.lists(st.integers(), max_size=3, unique=True)),
    st.builds(lambda b: {"BS": b}, st.lists(st.binary(max_size=3), max_size=2, unique=True)),
)
ATTRIBUTE_VALUES = st.recursive(
    SCALAR,
    lambda inner: st.one_of(
        st.builds(lambda m: {"M": m}, st.dictionaries(st.text(max_size=3), inner, max_size=3)),
        st.builds(lambda items: {"L": items}, st.lists(inner, max_size=3)),
    ),
    max_leaves=8,
)
AN_ITEM = st.dictionaries(st.text(min_size=1, max_size=4), ATTRIBUTE_VALUES, max_size=4)


def _serialized(operation: str, result: dict[str, Any], *, moto_s_own: bool) -> Any:
    from moto.core.serialize import JSONSerializer, ResponseSerializer, XFormedAttributePicker
    from moto.core.utils import get_service_model

    class MotoSOwn(JSONSerializer):
        get_value = ResponseSerializer.get_value

    cls = MotoSOwn if moto_s_own else JSONSerializer
    model = get_service_model("dynamodb").operation_model(operation)
    return cls(operation_model=model, pretty_print=False, value_picker=XFormedAttributePicker()).serialize(result)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(items=st.lists(AN_ITEM, max_size=3), one=AN_ITEM)
def test_dynamodb_answers_are_moto_s_own_bytes(items: list[dict[str, Any]], one: dict[str, Any]) -> None:
    """`cheap_moto_attribute_values` reads an attribute value's members with `dict.get` instead of moto's lookup by
    alias: every answer that carries items (Query/Scan, GetItem, UpdateItem's Attributes, BatchGetItem) is the same
    response, byte for byte, as moto's own serializer gives."""
    patch_moto()
    results: dict[str, dict[str, Any]] = {
        "Query": {"Items": items, "Count": len(items), "ScannedCount": len(items), "LastEvaluatedKey": one or None},
        "GetItem": {"Item": one},
        "UpdateItem": {"Attributes": one},
        "BatchGetItem": {"Responses": {"ledger": items}, "UnprocessedKeys": {}},
        "TransactGetItems": {"Responses": [{"Item": item} for item in items]},
    }
    for operation, result in results.items():
        assert _serialized(operation, result, moto_s_own=False) == _serialized(operation, result, moto_s_own=True)


def test_an_attribute_value_moto_stores_otherwise_is_serialized_by_moto_s_lookup() -> None:
    """A value with a key that is not a member of `AttributeValue` (or not a dict) goes moto's generic way."""
    patch_moto()
    for odd in ({"S": "x", "extra": 1}, {"s": "lower"}):
        result = {"Item": {"a": odd}}
        assert _serialized("GetItem", result, moto_s_own=False) == _serialized("GetItem", result, moto_s_own=True)


# ------------------------------------------------------------------------------ update expressions, parsed once

#: (UpdateExpression, ExpressionAttributeNames): valid updates of every kind, then each of moto's validation errors
#: (syntax, clauses, duplicate and overlapping paths, key attributes, undefined names and values, reserved words,
#: operand types, a missing attribute, a bad document path, an index key's type).
EXPRESSION_CASES: tuple[tuple[str, dict[str, str]], ...] = (
    ("SET a = :s", {}),
    ("SET #n = :n, b = :s", {"#n": "n"}),
    ("SET n = n + :one, m.kid = :s, l[0] = :s", {}),
    ("SET n = n - :one REMOVE a ADD c :one", {}),
    ("SET l = list_append(l, :list), x = if_not_exists(x, :s)", {}),
    ("SET l = list_append(:list, l), y = if_not_exists(n, :one) + :one", {}),
    ("REMOVE l[1], m.kid", {}),
    ("ADD ss :ss DELETE ss2 :ss", {}),
    ("SET " + ", ".join(f"a{i} = :s" for i in range(20)), {}),
    ("  SET   a=:s ,b  =  :n  ", {}),
    ("SET a = ", {}),
    ("SET = :s", {}),
    ("FOO a = :s", {}),
    ("SET a = :s SET b = :s", {}),
    ("REMOVE a REMOVE b", {}),
    ("ADD a :one ADD b :one", {}),
    ("SET a = :s, a = :n", {}),
    ("SET m.kid = :s, m = :n", {}),
    ("SET m.inner = :s", {}),
    ("SET #a = :s, #b = :n", {"#a": "same", "#b": "same"}),
    ("SET pk = :s", {}),
    ("SET #k = :s", {"#k": "sk"}),
    ("SET a = :undefined", {}),
    ("SET #undefined = :s", {}),
    ("SET name = :s", {}),
    ("SET n = n + :s", {}),
    ("SET l = list_append(l, :s)", {}),
    ("SET a = nothing + :one", {}),
    ("SET nothing.deeper = :s", {}),
    ("SET g = :one", {}),
)
#: The expression attribute values the cases use (each request carries those its expression names).
EXPRESSION_VALUES = {
    ":s": {"S": "v"},
    ":n": {"N": "7"},
    ":one": {"N": "1"},
    ":list": {"L": [{"S": "z"}]},
    ":ss": {"SS": ["v"]},
}
EXPRESSION_ITEM = {
    "n": {"N": "1"},
    "m": {"M": {"kid": {"S": "i"}}},
    "l": {"L": [{"S": "x"}, {"S": "y"}]},
    "ss2": {"SS": ["v", "w"]},
    "a": {"S": "old"},
}


def _answer(call: Any, **request: Any) -> Any:
    """moto's answer to a request: the response without its metadata, the error's code, message and reasons, or
    the exception moto raised (an `AssertionError` of its validator, for instance)."""
    try:
        return {name: value for name, value in call(**request).items() if name != "ResponseMetadata"}
    except ClientError as error:
        reasons = [reason.get("Message") for reason in error.response.get("CancellationReasons", [])]
        return [error.response["Error"]["Code"], error.response["Error"]["Message"], reasons]
    except Exception as error:  # moto's own crash is an answer to compare too
        return [type(error).__name__, str(error)]


def _update_table(ddb: Any) -> None:
    """Table `t` (pk, sk) with an index on the string attribute `g`."""
    key_schema = [{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}]
    ddb.create_table(
        TableName="t",
        KeySchema=key_schema,
        AttributeDefinitions=[{"AttributeName": name, "AttributeType": "S"} for name in ("pk", "sk", "g")],
        GlobalSecondaryIndexes=[
            {
                "IndexName": "by-g",
                "KeySchema": [{"AttributeName": "g", "KeyType": "HASH"}],
                "Projection": {"ProjectionType": "ALL"},
            }
        ],
        BillingMode="PAY_PER_REQUEST",
    )


def update_answers() -> list[Any]:
    """What moto answers to each of `EXPRESSION_CASES`, twice over (the second time from the parser's cache, when
    patched), on an existing item and on a new one, alone and in a transaction, and the items it then holds."""
    from moto import mock_aws

    answers = []
    with mock_aws():
        ddb = boto3.client("dynamodb", region_name="us-east-1")
        _update_table(ddb)
        for round_, (case, (expression, names)) in itertools.product(range(2), enumerate(EXPRESSION_CASES)):
            old, new, in_transaction = ({"pk": {"S": f"{round_}#{case}"}, "sk": {"S": sk}} for sk in ("o", "n", "t"))
            ddb.put_item(TableName="t", Item=old | EXPRESSION_ITEM)
            values = {
                name: EXPRESSION_VALUES[name] for name in re.findall(r":\w+", expression) if name in EXPRESSION_VALUES
            }
            request = {"TableName": "t", "UpdateExpression": expression}
            request |= ({"ExpressionAttributeNames": names} if names else {}) | (
                {"ExpressionAttributeValues": values} if values else {}
            )
            for key in (old, new):
                answers.append(_answer(ddb.update_item, **request, Key=key, ReturnValues="ALL_NEW"))
            updates = [{"Update": request | {"Key": old}}, {"Update": request | {"Key": in_transaction}}]
            answers.append(_answer(ddb.transact_write_items, TransactItems=updates))
            answers.append([ddb.get_item(TableName="t", Key=key).get("Item") for key in (old, new, in_transaction)])
    return answers


def test_updates_give_moto_s_own_answers_with_each_expression_parsed_once(
    aws_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`cheap_moto_update_expressions` keeps moto's parse of an update expression, copies it for a validation node by
    node, counts its clauses once, and builds each validation step's map once: every answer (the items, each
    ValidationException's message) is what an unpatched moto gives in a fresh process; and an expression UpdateItem
    sees again is not tokenized again (moto tokenized it twice per call: in the request and in the model), nor a
    processing map built for each node of its tree."""
    from moto import mock_aws
    from moto.dynamodb.parsing import expressions, validators

    script = "import json; from tests.integration.local.test_moto_patches import update_answers; "
    moto_s_own = subprocess.run(
        [sys.executable, "-c", script + "print(json.dumps(update_answers()))"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    patch_moto()
    assert json.loads(json.dumps(update_answers())) == json.loads(moto_s_own.stdout)

    tokenized, maps = itertools.count(), itertools.count()
    tokenize = expressions.ExpressionTokenizer.make_list
    values_map = validators.ExpressionAttributeValueProcessor._processing_map
    monkeypatch.setattr(expressions.ExpressionTokenizer, "make_list", lambda text: (next(tokenized), tokenize(text))[1])
    monkeypatch.setattr(
        validators.ExpressionAttributeValueProcessor, "_processing_map", lambda self: (next(maps), values_map(self))[1]
    )
    with mock_aws():
        ddb = boto3.client("dynamodb", region_name="us-east-1")
        _update_table(ddb)
        key = {"pk": {"S": "once"}, "sk": {"S": "once"}}
        ddb.put_item(TableName="t", Item=key)
        for i in range(5):
            ddb.update_item(
                TableName="t",
                Key=key,
                UpdateExpression="SET once_a = :v, once_b = list_append(:l, :l)",
                ExpressionAttributeValues={":v": {"N": str(i)}, ":l": {"L": [{"N": str(i)}]}},
            )
        assert ddb.get_item(TableName="t", Key=key)["Item"]["once_b"] == {"L": [{"N": "4"}, {"N": "4"}]}
    assert next(tokenized) == 1, "the expression is tokenized once"
    assert next(maps) == 5, "one processing map per validation, not one per node"


def test_a_parsed_expression_is_copied_as_deepcopy_copies_it_and_any_other_tree_left_to_deepcopy() -> None:
    """`_copy_tree` stands in for `copy.deepcopy` only on a tree `_is_plain_tree` accepts: on each case's parse it
    gives the same classes, attributes (in their order), leaves and parent links, and shares no node; a node with
    another attribute, a broken parent link, a shared node or a mutable leaf keep moto's `deepcopy`."""
    from moto.dynamodb.exceptions import InvalidUpdateExpression
    from moto.dynamodb.parsing.ast_nodes import Node
    from moto.dynamodb.parsing.expressions import UpdateExpressionParser
    from moto.dynamodb.parsing.tokens import ExpressionTokenizer

    def shape(node: Any, parent: Any) -> Any:
        if not isinstance(node, Node):
            return node
        assert node.parent is parent
        return type(node), list(vars(node)), node.type, [shape(child, node) for child in node.children or []]

    def parse(expression: str) -> Any:
        return UpdateExpressionParser(ExpressionTokenizer.make_list(expression)).parse()

    parsed = 0
    for expression, _ in EXPRESSION_CASES:
        try:
            tree = parse(expression)
        except InvalidUpdateExpression:  # the syntax errors among the cases
            continue
        parsed += 1
        assert moto_server._is_plain_tree(tree, None, set(), Node), expression
        copied = moto_server._copy_tree(tree, None, Node)
        assert shape(copied, None) == shape(copy.deepcopy(tree), None) == shape(tree, None), expression
        assert not {id(node) for node in _nodes(copied)} & {id(node) for node in _nodes(tree)}, expression
    assert parsed == len(EXPRESSION_CASES) - 3
    odd = [parse("SET a = :s, b = :s") for _ in range(4)]
    odd[0].children[0].extra = 1
    odd[1].children[0].parent = None
    odd[2].children.append(odd[2].children[0])
    next(node for node in _nodes(odd[3]) if node.children and not isinstance(node.children[0], Node)).children = [[]]
    assert not any(moto_server._is_plain_tree(tree, None, set(), Node) for tree in odd)


def _nodes(tree: Any) -> list[Any]:
    from moto.dynamodb.parsing.ast_nodes import Node

    return [tree] + [node for child in tree.children or [] if isinstance(child, Node) for node in _nodes(child)]


# ------------------------------------------------------------------------------------------ query = moto's


def _wire(pk: str, sk: str, dl: str | None, dl_sk: int | None, ob: str | None, ob_sk: int | None, x: int) -> Any:
    item: dict[str, Any] = {keys.PK: {"S": pk}, keys.SK: {"S": sk}, "x": {"N": str(x)}}
    for name, value in ((keys.DEADLINE_PK, dl), (keys.OUTBOX_PK, ob)):
        if value is not None:
            item[name] = {"S": value}
    for name, number in ((keys.DEADLINE_SK, dl_sk), (keys.OUTBOX_SK, ob_sk)):
        if number is not None:
            item[name] = {"N": str(number)}
    return item


ITEMS = st.builds(_wire, st.sampled_from(PKS), st.sampled_from(SKS), DL, EPOCH, OB, EPOCH, st.integers(0, 2))
#: New values an update may give each attribute (None: REMOVE), each of the attribute's type: strings for the index
#: partition keys, numbers for the index sort keys (the table's AttributeDefinitions) and for `x` (the filter's).
#: Real DynamoDB refuses an index key of the wrong type (ValidationException); moto stores it, and its own Query
#: then fails to sort the index ('<' between str and Decimal), so a wrong type tests nothing but moto's crash.
UPDATE_VALUES: dict[str, st.SearchStrategy[str | int | None]] = {
    keys.DEADLINE_PK: st.one_of(st.none(), st.sampled_from(("DL#0", "DL#1"))),
    keys.DEADLINE_SK: EPOCH,
    keys.OUTBOX_PK: st.one_of(st.none(), st.just("OB#0")),
    keys.OUTBOX_SK: EPOCH,
    "x": st.one_of(st.none(), st.integers(0, 2)),
}
#: Attribute changes of an update: name -> new value (None: REMOVE).
CHANGES = st.lists(st.sampled_from(sorted(UPDATE_VALUES)), min_size=1, max_size=3, unique=True).flatmap(
    lambda names: st.fixed_dictionaries({name: UPDATE_VALUES[name] for name in names})
)


def _key(pk: str, sk: str) -> dict[str, Any]:
    return {keys.PK: {"S": pk}, keys.SK: {"S": sk}}


def _update(table: str, key: tuple[str, str], changes: dict[str, Any], guarded: bool) -> dict[str, Any]:
    sets, removes = [], []
    names: dict[str, str] = {}
    values: dict[str, Any] = {}
    for i, (name, value) in enumerate(sorted(changes.items())):
        names[f"#a{i}"] = name
        if value is None:
            removes.append(f"#a{i}")
        else:
            sets.append(f"#a{i} = :v{i}")
            values[f":v{i}"] = {"N": str(value)} if isinstance(value, int) else {"S": value}
    expression = " ".join(
        part
        for part in ("SET " + ", ".join(sets) if sets else "", "REMOVE " + ", ".join(removes) if removes else "")
        if part
    )
    request: dict[str, Any] = {
        "TableName": table,
        "Key": _key(*key),
        "UpdateExpression": expression,
        "ExpressionAttributeNames": names,
    }
    if values:
        request["ExpressionAttributeValues"] = values
    if guarded:  # fails on a missing item: a condition failure must leave the index as it was
        request["ConditionExpression"] = "attribute_exists(pk)"
    return request


WRITE = st.one_of(
    st.tuples(st.just("put"), ITEMS),
    st.tuples(st.just("update"), KEY, CHANGES, st.booleans()),
    st.tuples(st.just("delete"), KEY),
)

QUERY = st.fixed_dictionaries(
    {
        "target": st.sampled_from(("table", keys.DEADLINE_INDEX, keys.OUTBOX_INDEX)),
        "partition": st.integers(0, 2),
        "range": st.sampled_from((None, "lt", "between", "begins")),
        "limit": st.one_of(st.none(), st.integers(1, 3)),
        "forward": st.booleans(),
        "filter": st.one_of(st.none(), st.integers(0, 2)),
        "select_count": st.booleans(),
    }
)


def _query_request(table: str, spec: dict[str, Any]) -> dict[str, Any]:
    names: dict[str, str] = {}
    values: dict[str, Any] = {}
    if spec["target"] == "table":
        names |= {"#p": keys.PK, "#s": keys.SK}
        values[":p"] = {"S": PKS[spec["partition"]]}
        ranges = {
            "lt": ("#s < :a", {":a": {"S": "R#2"}}),
            "between": ("#s BETWEEN :a AND :b", {":a": {"S": "G#2"}, ":b": {"S": "R#2#0"}}),
            "begins": ("begins_with(#s, :a)", {":a": {"S": "R#"}}),
        }
    else:
        pk, sk = (
            (keys.DEADLINE_PK, keys.DEADLINE_SK)
            if spec["target"] == keys.DEADLINE_INDEX
            else (keys.OUTBOX_PK, keys.OUTBOX_SK)
        )
        names |= {"#p": pk, "#s": sk}
        partitions = ("DL#0", "DL#1", "DL#9") if pk == keys.DEADLINE_PK else ("OB#0", "OB#9", "OB#0")
        values[":p"] = {"S": partitions[spec["partition"]]}
        ranges = {
            "lt": ("#s < :a", {":a": {"N": "3"}}),
            "between": ("#s BETWEEN :a AND :b", {":a": {"N": "1"}, ":b": {"N": "3"}}),
            "begins": ("#s >= :a", {":a": {"N": "2"}}),
        }
    condition = "#p = :p"
    if spec["range"] is None:
        del names["#s"]
    else:
        extra, more = ranges[spec["range"]]
        condition += f" AND {extra}"
        values |= more
    request: dict[str, Any] = {
        "TableName": table,
        "KeyConditionExpression": condition,
        "ExpressionAttributeNames": names,
        "ScanIndexForward": spec["forward"],
    }
    if spec["target"] != "table":
        request["IndexName"] = spec["target"]
    if spec["limit"] is not None:
        request["Limit"] = spec["limit"]
    if spec["filter"] is not None:
        request["FilterExpression"] = "x = :x"
        values[":x"] = {"N": str(spec["filter"])}
    if spec["select_count"]:
        request["Select"] = "COUNT"
    request["ExpressionAttributeValues"] = values
    return request


def _pages(ddb: Any, request: dict[str, Any]) -> list[dict[str, Any]]:
    pages: list[dict[str, Any]] = []
    request = dict(request)
    for _ in range(60):  # at most 7x3 items, one per page, plus the empty last page
        page = ddb.query(**request)
        page.pop("ResponseMetadata", None)
        pages.append(page)
        if "LastEvaluatedKey" not in page:
            return pages
        request["ExclusiveStartKey"] = page["LastEvaluatedKey"]
    raise AssertionError("query did not end")


def assert_same_as_moto(ddb: Any, table: str, spec: dict[str, Any]) -> None:
    request = _query_request(table, spec)
    patched = _pages(ddb, request)
    with unpatched_queries():
        reference = _pages(ddb, request)
    assert patched == reference, request


def _write(ddb: Any, table: str, op: tuple[Any, ...]) -> None:
    kind = op[0]
    try:
        if kind == "put":
            ddb.put_item(TableName=table, Item=op[1])
        elif kind == "update":
            ddb.update_item(**_update(table, op[1], op[2], op[3]))
        elif kind == "delete":
            ddb.delete_item(TableName=table, Key=_key(*op[1]))
    except ClientError as error:
        if error.response["Error"]["Code"] != "ConditionalCheckFailedException":
            raise


def _transaction(ddb: Any, table: str, ops: list[tuple[Any, ...]], cancel: bool) -> None:
    entries: list[dict[str, Any]] = []
    for op in ops:
        if op[0] == "put":
            entries.append({"Put": {"TableName": table, "Item": op[1]}})
        elif op[0] == "update":
            entries.append({"Update": _update(table, op[1], op[2], False)})
        else:
            entries.append({"Delete": {"TableName": table, "Key": _key(*op[1])}})
    if cancel:  # the last entry fails: every earlier write must be undone, in the table and in the index buckets
        entries.append(
            {
                "ConditionCheck": {
                    "TableName": table,
                    "Key": _key("B#z", "never"),
                    "ConditionExpression": "attribute_exists(pk)",
                }
            }
        )
    try:
        ddb.transact_write_items(TransactItems=entries)
    except ClientError as error:
        if error.response["Error"]["Code"] not in ("TransactionCanceledException", "ValidationException"):
            raise


def _op_key(op: tuple[Any, ...]) -> tuple[str, str]:
    if op[0] == "put":
        return op[1][keys.PK]["S"], op[1][keys.SK]["S"]
    return op[1]


STEP = st.one_of(
    WRITE,
    st.tuples(st.just("transact"), st.lists(WRITE, min_size=1, max_size=4, unique_by=_op_key), st.booleans()),
    st.tuples(
        st.just("batch"),
        st.lists(st.sampled_from(("put", "delete")), min_size=1, max_size=4),
        st.lists(ITEMS, min_size=4, max_size=4, unique_by=lambda i: (i[keys.PK]["S"], i[keys.SK]["S"])),
    ),
    st.tuples(st.just("query"), QUERY),
)


def test_queries_give_moto_s_own_answers_as_items_are_written_moved_and_deleted(ddb: Any) -> None:
    """Random writes (puts, updates moving items between index partitions or out of an index, deletes, batches,
    transactions committed and cancelled) interleaved with random queries on the table and both GSIs (key
    conditions, Limit and ExclusiveStartKey pages, both directions, filters, COUNT): every page equals moto's own."""

    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(steps=st.lists(STEP, min_size=1, max_size=25), final=st.lists(QUERY, min_size=3, max_size=6))
    def run(steps: list[tuple[Any, ...]], final: list[dict[str, Any]]) -> None:
        table = new_table(ddb)
        for step in steps:
            kind = step[0]
            if kind == "query":
                assert_same_as_moto(ddb, table, step[1])
            elif kind == "transact":
                _transaction(ddb, table, step[1], step[2])
            elif kind == "batch":
                requests = [
                    {"PutRequest": {"Item": item}}
                    if action == "put"
                    else {"DeleteRequest": {"Key": _key(item[keys.PK]["S"], item[keys.SK]["S"])}}
                    for action, item in zip(step[1], step[2], strict=False)
                ]
                ddb.batch_write_item(RequestItems={table: requests})
            else:
                _write(ddb, table, step)
        for spec in final:
            assert_same_as_moto(ddb, table, spec)
        ddb.delete_table(TableName=table)

    run()


@given(changes=CHANGES)
def test_updates_give_each_attribute_a_value_of_its_type(changes: dict[str, Any]) -> None:
    """Every value an update writes has the type real DynamoDB accepts: an index key's AttributeDefinitions type,
    a number for `x` (the queries filter on `x = :x` with a number)."""
    wanted = {
        definition["AttributeName"]: definition["AttributeType"]
        for definition in create_table_kwargs("ledger")["AttributeDefinitions"]
    } | {"x": "N"}
    request = _update("ledger", ("B#a", "R#1#0"), changes, guarded=False)
    for placeholder, name in request["ExpressionAttributeNames"].items():
        value = request.get("ExpressionAttributeValues", {}).get(placeholder.replace("#a", ":v"))
        if value is not None:
            assert list(value) == [wanted[name]], (name, value)


def test_an_item_moved_between_index_partitions_and_removed_from_the_index(ddb: Any) -> None:
    table = new_table(ddb)
    ddb.put_item(TableName=table, Item=_wire("B#a", "R#1#0", "DL#0", 1, None, None, 0))
    due = {
        "target": keys.DEADLINE_INDEX,
        "range": None,
        "limit": None,
        "forward": True,
        "filter": None,
        "select_count": False,
    }

    def deadline_pks(partition: int) -> list[str]:
        items = ddb.query(**_query_request(table, {**due, "partition": partition}))["Items"]
        assert_same_as_moto(ddb, table, {**due, "partition": partition})
        return [item[keys.SK]["S"] for item in items]

    assert deadline_pks(0) == ["R#1#0"]
    ddb.update_item(**_update(table, ("B#a", "R#1#0"), {keys.DEADLINE_PK: "DL#1"}, True))
    assert (deadline_pks(0), deadline_pks(1)) == ([], ["R#1#0"])
    _transaction(ddb, table, [("update", ("B#a", "R#1#0"), {keys.DEADLINE_PK: "DL#0"}, False)], cancel=True)
    assert (deadline_pks(0), deadline_pks(1)) == ([], ["R#1#0"])
    ddb.update_item(**_update(table, ("B#a", "R#1#0"), {keys.DEADLINE_PK: None}, True))
    assert (deadline_pks(0), deadline_pks(1)) == ([], [])
    ddb.put_item(TableName=table, Item=_wire("B#a", "R#1#0", "DL#1", 2, None, None, 0))
    assert deadline_pks(1) == ["R#1#0"]
    ddb.delete_item(TableName=table, Key=_key("B#a", "R#1#0"))
    assert deadline_pks(1) == []


def test_queries_do_not_read_the_rest_of_the_table(ddb: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The cost of a query must not grow with the table: moto's `Table.all_items` (every item, sorted) is never
    called for a query on a partition or on an index partition (it was, for every page, before the patch)."""
    from moto.dynamodb.models.table import Table

    table = new_table(ddb)
    ddb.put_item(TableName=table, Item=_wire("B#a", "R#1#0", "DL#0", 1, "OB#0", 2, 0))
    ddb.put_item(TableName=table, Item=_wire("B#b", "R#1#0", None, None, None, None, 0))

    def every_item(self: Any) -> list[Any]:
        raise AssertionError("a query read every item of the table")

    monkeypatch.setattr(Table, "all_items", every_item)
    base = {"range": None, "limit": 1, "forward": True, "filter": None, "select_count": False, "partition": 0}
    for target in ("table", keys.DEADLINE_INDEX, keys.OUTBOX_INDEX):
        pages = _pages(ddb, _query_request(table, {**base, "target": target}))
        assert sum(page["Count"] for page in pages) == 1


def test_a_partition_query_sorts_only_the_items_its_sort_key_condition_selects(
    ddb: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """moto sorts its candidates before applying the sort key condition: a batch partition holds every rollout, so a
    `begins_with` Query of its few counters must not hand moto the whole partition to sort (only what the condition
    selects, and the nearest item on each side: moto's LastEvaluatedKey depends on them)."""
    from rollout_pipeline.local import moto_server

    table = new_table(ddb)
    for i in range(30):
        ddb.put_item(TableName=table, Item=_wire("B#a", f"R#{i}#0", None, None, None, None, 0))
    ddb.put_item(TableName=table, Item=_wire("B#a", "G#1", None, None, None, None, 0))
    handed: list[int] = []
    moto_candidates = moto_server._Candidates.all_items

    def recorded(self: Any) -> list[Any]:
        items = moto_candidates(self)
        handed.append(len(items))
        return items

    monkeypatch.setattr(moto_server._Candidates, "all_items", recorded)
    base = {"limit": None, "forward": True, "filter": None, "select_count": False, "partition": 0, "target": "table"}
    pages = _pages(ddb, _query_request(table, {**base, "range": "between"}))  # sort keys G#2 .. R#2#0
    selected = [sk for sk in [f"R#{i}#0" for i in range(30)] + ["G#1"] if "G#2" <= sk <= "R#2#0"]
    assert [item[keys.SK]["S"] for page in pages for item in page["Items"]] == sorted(selected)
    assert handed == [len(selected) + 2], "moto was handed what the condition selects and its neighbours only"
