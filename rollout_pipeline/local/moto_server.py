"""A moto server on loopback holding the experiment's AWS resources for local mode."""

from __future__ import annotations

import contextlib
import copy
import functools
import importlib
import inspect
import os
import socket
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Final

LOOPBACK = "127.0.0.1"
LOCAL_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "local",
    "AWS_SECRET_ACCESS_KEY": "local",
    "AWS_SESSION_TOKEN": "local",
}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        port: int = sock.getsockname()[1]
        return port


def local_aws_environ(endpoint_url: str, region: str) -> dict[str, str]:
    """Environment that points boto3 (in this process or a child) at the local moto server."""
    return {
        **LOCAL_CREDENTIALS,
        "AWS_ENDPOINT_URL": endpoint_url,
        "AWS_DEFAULT_REGION": region,
        "AWS_REGION": region,
    }


#: The X-Amz-Target prefixes of the services whose requests local mode's server runs one at a time (see
#: `SerializedServices`).
SERIALIZED_TARGETS: Final = ("DynamoDB", "AWSEvents")


class SerializedServices:
    """WSGI middleware running the requests of each service in `SERIALIZED_TARGETS` one at a time.

    moto's TransactWriteItems snapshots every table and restores the snapshot when a condition fails, so a failing
    transaction running concurrently with another request undoes that request's writes. Real DynamoDB never does;
    serialising DynamoDB calls restores its atomicity. moto's EventBridge iterates a bus's rules (and a rule's
    targets) unlocked, so a PutEvents racing a PutRule or DeleteRule (a consumer subscribing or unsubscribing while
    the pipeline publishes) fails with "OrderedDict mutated during iteration"; real EventBridge never does.
    Each service has its own lock; the others stay concurrent (SQS long polls must not hold a lock).
    """

    def __init__(self, app: Any) -> None:
        self.app = app
        self.locks = {target: threading.Lock() for target in SERIALIZED_TARGETS}

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Any:
        target = str(environ.get("HTTP_X_AMZ_TARGET", ""))
        lock = next((lock for prefix, lock in self.locks.items() if target.startswith(prefix)), None)
        if lock is None:
            return self.app(environ, start_response)
        with lock:
            return list(self.app(environ, start_response))


#: The moto version the patches below were written for (constraints.txt and pyproject pin it). They reach into
#: moto's internals; under any other version `patch_moto` leaves moto as it is (correct, but slower as the ledger
#: fills) and tests/integration/local/test_moto_patches.py fails until someone re-reads moto and updates this.
PATCHED_MOTO_VERSION: Final = "5.2.5"

#: The attribute of a moto `Table` holding `_Buckets` per indexed attribute name.
_BUCKETS_ATTR: Final = "_rollouts_buckets"
#: DynamoDB key attribute types: an index bucket is keyed by (type, value as moto compares it).
_KEY_TYPES: Final = frozenset({"S", "N", "B"})

_patch_lock = threading.Lock()
_index_lock = threading.RLock()
_unpatched_queries = threading.local()


def moto_version() -> str:
    """The installed moto version."""
    import moto

    return str(moto.__version__)


def moto_patchable() -> bool:
    """Whether the installed moto is the version the patches were written for."""
    return moto_version() == PATCHED_MOTO_VERSION


def _refuse_other_moto(patch: str) -> bool:
    """True (and a warning) when the installed moto is not `PATCHED_MOTO_VERSION`: the patch must not apply."""
    if moto_patchable():
        return False
    warnings.warn(
        f"{patch}: written for moto {PATCHED_MOTO_VERSION}, found moto {moto_version()}; moto left unpatched "
        "(correct, but local mode slows down as the ledger fills)",
        RuntimeWarning,
        stacklevel=3,
    )
    return True


def patch_moto() -> None:
    """Make moto's DynamoDB cost independent of the table's size (transactions and queries), its SQS receives
    atomic, its SQS requests one pass over the queue, its EventBridge targets free of parser builds, its DynamoDB
    answers free of a lookup by alias for each member of each attribute value and its UpdateItem free of a parse and
    of quadratic checks per call (see each patch)."""
    cheap_moto_transactions()
    indexed_moto_queries()
    atomic_moto_receives()
    cheap_moto_queues()
    cheap_moto_event_targets()
    cheap_moto_attribute_values()
    cheap_moto_update_expressions()


def is_dynamodb_request(request: Any) -> bool:
    """Whether a botocore request (as moto's stubber sees it) is a DynamoDB call."""
    target = request.headers.get("X-Amz-Target") or b""
    return (target.decode() if isinstance(target, bytes) else str(target)).startswith("DynamoDB")


def serialised_dynamodb_requests(process_request: Callable[..., Any]) -> Callable[..., Any]:
    """In-process moto (`mock_aws`: tests, benches) as local mode's server serves DynamoDB
    (`SerializedServices`): `process_request` (moto's `BotocoreStubber.process_request`) wrapped so DynamoDB requests
    run one at a time, their answers included (moto builds an `UpdateItem`'s returned item after its backend call,
    from the live item: a concurrent write could show in it, so two reservations of one schedule read the same start),
    other services concurrent."""
    lock = threading.RLock()

    def serialised(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        if not is_dynamodb_request(request):
            return process_request(self, request, *args, **kwargs)
        with lock:
            return process_request(self, request, *args, **kwargs)

    return serialised


#: moto's SQS operations that read or change a queue's messages, run one at a time by `atomic_moto_receives`.
_SQS_OPERATIONS: Final = (
    "send_message",
    "send_message_batch",
    "delete_message",
    "delete_message_batch",
    "change_message_visibility",
    "change_message_visibility_batch",
    "purge_queue",
)
_sqs_lock = threading.RLock()


def atomic_moto_receives() -> None:
    """Make moto's SQS hand a message to one receiver at a time, as SQS's visibility timeout does.

    moto's ReceiveMessage checks that a message is visible, then marks it received, with nothing held between: two
    concurrent receives (local mode's pollers, a test's consumers) could both get it, or fail with `Set changed
    size during iteration` while another request changes the queue. Here each look at the queue (a receive without
    its wait) and each other change of its messages runs under one lock; a long poll waits for messages outside it,
    so a send is never held behind one. Idempotent; applies to in-process moto and to the moto server of this
    process; a no-op (with a warning) on another moto version than `PATCHED_MOTO_VERSION`.
    """
    from moto.sqs.models import SQSBackend

    with _patch_lock:
        if getattr(SQSBackend.receive_message, "rollouts_patched", False):
            return
        if _refuse_other_moto("atomic_moto_receives"):
            return
        moto_receive = SQSBackend.receive_message

        def receive(  # noqa: PLR0917 (moto's signature, called positionally)
            self: Any,
            queue_name: str,
            count: int,
            wait_seconds_timeout: int,
            visibility_timeout: int,
            message_attribute_names: list[str] | None = None,
        ) -> Any:
            deadline = time.monotonic() + (wait_seconds_timeout or 0)
            while True:
                with _sqs_lock:
                    got = moto_receive(self, queue_name, count, 0, visibility_timeout, message_attribute_names)
                left = deadline - time.monotonic()
                if got or left <= 0:
                    return got
                self.get_queue(queue_name).wait_for_messages(min(1.0, left))

        receive.rollouts_patched = True  # type: ignore[attr-defined]
        SQSBackend.receive_message = receive  # type: ignore[method-assign]
        for name in _SQS_OPERATIONS:
            setattr(SQSBackend, name, _under_sqs_lock(getattr(SQSBackend, name)))


def cheap_moto_queues() -> None:
    """Make moto's SQS cost one pass over a queue per request, not one per message it sends or returns.

    moto computes every attribute of a queue (its message counts: scans of all its messages, each message asked the
    time twice) for each message a send takes (to read `ContentBasedDeduplication`) and each message a receive
    returns (to read `MessageRetentionPeriod`, three times): a receive of 10 from a queue of 1,000 warm offers took
    0.8 s of CPU, a send of 10 to a queue of 500 rollouts 0.15 s, all under the lock `atomic_moto_receives` holds.
    Here the retention check reads the queue's period alone, and a scan reads the time once. Idempotent; a no-op
    (with a warning) on another moto version than `PATCHED_MOTO_VERSION`.
    """
    from moto.core import utils
    from moto.sqs.models import Queue, SQSBackend

    def retained(self: Any, queue_name: str, message: Any) -> bool:
        retention_s = int(self.get_queue(queue_name).message_retention_period)
        return bool(retention_s + message.sent_timestamp / 1000 > utils.unix_time())

    def visible(queue: Any) -> list[Any]:
        now = utils.unix_time_millis()
        return [m for m in queue._messages if now > m.visible_at and now >= m.delayed_until]

    def delayed(queue: Any) -> int:
        now = utils.unix_time_millis()
        return sum(1 for m in queue._messages if now < m.delayed_until)

    def not_visible(queue: Any) -> int:
        now = utils.unix_time_millis()
        return sum(1 for m in queue._messages if now <= m.visible_at)

    with _patch_lock:
        if getattr(SQSBackend.is_message_valid_based_on_retention_period, "rollouts_patched", False):
            return
        if _refuse_other_moto("cheap_moto_queues"):
            return
        for function in (retained, visible, delayed, not_visible):
            function.rollouts_patched = True  # type: ignore[union-attr]
        SQSBackend.is_message_valid_based_on_retention_period = retained  # type: ignore[method-assign]
        Queue.messages = property(visible)  # type: ignore[method-assign,assignment]
        Queue.approximate_number_of_messages_delayed = property(delayed)  # type: ignore[method-assign,assignment]
        Queue.approximate_number_of_messages_not_visible = property(not_visible)  # type: ignore[method-assign,assignment]


def cheap_moto_event_targets() -> None:
    """Make moto's EventBridge parse each JSONPath of a target's input once, not once per event and target.

    moto renders every event it sends to a rule's target through an input template (its default one when the
    target has no `InputTransformer`): 8 JSONPaths, each parsed by a new `jsonpath_ng` parser, whose construction
    builds its grammar tables (0.4 ms a path here, 3 ms an event and target). That was a fifth of local mode's CPU
    during a batch. Here `jsonpath_ng.ext.parse` (which moto imports at each call) keeps the paths it parsed: a
    parsed path is a tree that `find` only reads. Idempotent; a no-op (with a warning) on another moto version than
    `PATCHED_MOTO_VERSION`.
    """
    jsonpath: Any = importlib.import_module("jsonpath_ng.ext")
    with _patch_lock:
        if getattr(jsonpath.parse, "rollouts_patched", False):
            return
        if _refuse_other_moto("cheap_moto_event_targets"):
            return
        cached = functools.lru_cache(maxsize=1024)(jsonpath.parse)
        cached.rollouts_patched = True  # type: ignore[attr-defined]
        jsonpath.parse = cached


#: The members of DynamoDB's `AttributeValue` shape (botocore's service model).
_ATTRIBUTE_VALUE_MEMBERS: Final = frozenset({"S", "N", "B", "SS", "NS", "BS", "M", "L", "NULL", "BOOL"})


def cheap_moto_attribute_values() -> None:
    """Make moto's JSON serializer read a DynamoDB attribute value's members as the dict keys they are.

    moto writes a response by walking its shape, and finds each member of each structure on the value through its
    alias providers (five objects made, up to four names tried, per member): every attribute value of every item
    costs 10 such lookups, one per member of `AttributeValue`. A Query of 10 items of 18 attributes took 18 ms of
    CPU, 80% of it in the serializer (local mode's moto server and the in-process moto of the tests serve the
    ledger's reads this way). An attribute value that is a plain dict of `AttributeValue`'s member names is what
    moto's DynamoDB models give; on such a dict every alias of a member names a key it cannot hold, so the lookup
    finds the member's own key or nothing: here it is read with `dict.get`, and everything else (each member's
    serialization, any other shape or value) stays moto's. Idempotent; a no-op (with a warning) on another moto
    version than `PATCHED_MOTO_VERSION`.
    """
    from moto.core.serialize import BaseJSONSerializer

    with _patch_lock:
        if getattr(BaseJSONSerializer.get_value, "rollouts_patched", False):
            return
        if _refuse_other_moto("cheap_moto_attribute_values"):
            return
        moto_get_value = BaseJSONSerializer.get_value

        def get_value(self: Any, value: Any, key: str, shape: Any) -> Any:
            parent = getattr(shape, "parent", None)  # set by moto on the member's shape before this call
            if (
                type(value) is dict
                and parent is not None
                and parent.name == "AttributeValue"
                and value.keys() <= _ATTRIBUTE_VALUE_MEMBERS
                and not getattr(self._value_picker, "response_transformers", None)
            ):
                return value.get(key)
            return moto_get_value(self, value, key, shape)

        get_value.rollouts_patched = True  # type: ignore[attr-defined]
        BaseJSONSerializer.get_value = get_value  # type: ignore[method-assign]


#: The attribute of a moto `DepthFirstTraverser` holding its processing map and the map's node classes.
_MAP_ATTR: Final = "_rollouts_processing_map"
#: The attributes of a parsed update expression's node (`ast_nodes.Node.__init__`), and the types of its leaves.
_NODE_ATTRS: Final = frozenset({"type", "children", "parent"})
_ATOMS: Final = (str, int, bool, type(None))
#: Parsed update expressions (kept by the parser's cache) that `_copy_tree` copies as `copy.deepcopy` does and whose
#: clause counts moto accepts; and the copies of them made for a validation.
_plain_trees: weakref.WeakSet[Any] = weakref.WeakSet()
_counted_copies: weakref.WeakSet[Any] = weakref.WeakSet()


def _processing_map(traverser: Any) -> tuple[dict[type, Callable[[Any], Any]], tuple[type, ...]]:
    """A moto AST processor's `_processing_map()` (and its keys), built once per processor, not once per node."""
    found: tuple[dict[type, Callable[[Any], Any]], tuple[type, ...]] | None = traverser.__dict__.get(_MAP_ATTR)
    if found is None:
        mapping = traverser._processing_map()
        found = traverser.__dict__[_MAP_ATTR] = (mapping, tuple(mapping))
    return found


def _is_plain_tree(node: Any, parent: Any, seen: set[int], node_class: type) -> bool:
    """Whether `node` and all under it form a tree that `_copy_tree` copies as `copy.deepcopy` does: nodes holding
    only `_NODE_ATTRS` (a str `type`), each linked to its parent, children in lists, leaves of immutable types, no
    node or list found twice."""
    fields, children = node.__dict__, getattr(node, "children", None)
    if fields.keys() != _NODE_ATTRS or fields["parent"] is not parent or type(fields["type"]) is not str:
        return False
    if id(node) in seen or (children is not None and (type(children) is not list or id(children) in seen)):
        return False
    seen.update((id(node), id(children)))
    return children is None or all(
        _is_plain_tree(child, node, seen, node_class) if isinstance(child, node_class) else type(child) in _ATOMS
        for child in children
    )


def _copy_tree(node: Any, parent: Any, node_class: type) -> Any:
    """A copy of a tree `_is_plain_tree` accepts, hung under `parent`: new nodes, the same leaves."""
    new = object.__new__(type(node))
    new.__dict__.update(node.__dict__)  # moto's attributes, in their order
    new.parent, children = parent, node.children
    new.children = (
        None
        if children is None
        else [_copy_tree(child, new, node_class) if isinstance(child, node_class) else child for child in children]
    )
    return new


def cheap_moto_update_expressions() -> None:
    """Make moto's UpdateItem (and each Update of a TransactWriteItems) parse an update expression once per process
    and validate it without work per node that does not depend on the node.

    moto parses the expression twice a call (the request's check and the model's), deep-copies the parsed tree for
    each validation (two for a new item), has each of its 10 validation steps rebuild its map of node classes to
    handlers at every node, and counts the tree's SET/REMOVE/ADD clauses again at every node under it: 2.7 ms of CPU
    in moto's model for an UpdateItem of 10 attributes; moto's UpdateItem and TransactWriteItems took 23-25 s of the
    75-84 s of CPU of tests/integration/lifecycle (one process), 10.5 s patched. Here a parsed tree is kept (1,024
    expressions; moto only reads it, every validation works on a copy); a tree of moto's plain nodes (checked once:
    only moto's attributes, each linked to its parent, immutable leaves) is copied node by node, as `copy.deepcopy`
    copies it; its clause counts are checked once, on a copy (a tree that fails them keeps moto's own validation
    every time); and a validation step builds its map once. 1 / 5 / 10 / 20 attributes set: 0.30 / 1.2 / 2.7 / 6.2
    ms of CPU in moto's model became 0.14 / 0.47 / 0.93 / 1.9 ms. The answers stay moto's (every error and its
    message too: tests/integration/local/test_moto_patches.py compares them with an unpatched moto's).
    Idempotent; a no-op (with a warning) on another moto version than `PATCHED_MOTO_VERSION`.
    """
    validators: Any = importlib.import_module("moto.dynamodb.parsing.validators")  # moto's modules, untyped
    DepthFirstTraverser, Node = validators.DepthFirstTraverser, validators.Node
    UpdateExpressionParser = importlib.import_module("moto.dynamodb.parsing.expressions").UpdateExpressionParser

    with _patch_lock:
        if getattr(DepthFirstTraverser.process, "rollouts_patched", False):
            return
        if _refuse_other_moto("cheap_moto_update_expressions"):
            return
        moto_parse, moto_count = UpdateExpressionParser.make, validators.ActionCountValidator.traverse

        def nodes_to_be_processed(self: Any) -> tuple[type, ...]:
            return _processing_map(self)[1]

        def process(self: Any, node: Any) -> Any:
            for class_key, processor in _processing_map(self)[0].items():
                if isinstance(node, class_key):
                    return processor(node)
            return None

        @functools.lru_cache(maxsize=1024)
        def parse(expression: str) -> Any:
            tree = moto_parse(expression)
            with contextlib.suppress(Exception):  # moto raises it again when it validates a copy of this tree
                if isinstance(tree, Node) and _is_plain_tree(tree, None, set(), Node):
                    moto_count(validators.ActionCountValidator(), _copy_tree(tree, None, Node))
                    _plain_trees.add(tree)
            return tree

        def tree_copy(value: Any, memo: Any = None) -> Any:
            if memo is not None or not isinstance(value, Node) or value not in _plain_trees:
                return copy.deepcopy(value, memo)
            new = _copy_tree(value, None, Node)
            _counted_copies.add(new)
            return new

        def count(self: Any, node: Any) -> Any:
            return node if node in _counted_copies else moto_count(self, node)

        for patched in (nodes_to_be_processed, process, parse, tree_copy, count):
            setattr(patched, "rollouts_patched", True)  # noqa: B010 (a function attribute mypy does not know)
        DepthFirstTraverser.nodes_to_be_processed = nodes_to_be_processed
        DepthFirstTraverser.process = process
        UpdateExpressionParser.make = staticmethod(parse)
        validators.deepcopy = tree_copy
        validators.ActionCountValidator.traverse = count


def _under_sqs_lock(operation: Any) -> Any:
    def locked(*args: Any, **kwargs: Any) -> Any:
        with _sqs_lock:
            return operation(*args, **kwargs)

    locked.rollouts_patched = True  # type: ignore[attr-defined]
    return locked


class _TablesNotCopied:
    """Stands in for the `copy` module inside moto's DynamoDB models: deep copies of anything but a whole table."""

    @staticmethod
    def deepcopy(value: Any, memo: Any = None) -> Any:
        from moto.dynamodb.models.table import Table

        return value if isinstance(value, Table) else copy.deepcopy(value, memo)


def cheap_moto_transactions() -> None:
    """Make moto's TransactWriteItems cost O(items in the transaction), not O(table size); keep it atomic.

    moto deep-copies every table a transaction names, for every item, to restore them if the transaction fails:
    local mode slowed down with every rollout it recorded. Instead, snapshot only the items the transaction touches
    and put exactly those back when it fails (conditions, validation errors, anything), so a cancelled transaction
    still changes nothing; moto's own implementation does the rest (its cancellation reasons included).
    Idempotent; applies to in-process moto and to the moto server of this process; a no-op (with a warning) on
    another moto version than `PATCHED_MOTO_VERSION`.
    """
    from moto.dynamodb import models
    from moto.dynamodb.models.dynamo_type import DynamoType

    with _patch_lock:
        if getattr(models.DynamoDBBackend.transact_write_items, "rollouts_patched", False):
            return
        if _refuse_other_moto("cheap_moto_transactions"):
            return

        original = models.DynamoDBBackend.transact_write_items

        def transact(self: Any, transact_items: list[dict[str, Any]]) -> None:
            snapshot: list[tuple[Any, Any, Any, Any]] = []
            for entry in transact_items[:100]:
                op_type, op = next(iter(entry.items()))
                table = self.tables.get(op.get("TableName"))
                key = op.get("Item") if op_type == "Put" else op.get("Key")
                if table is None or not key or table.hash_key_attr not in key:
                    continue
                hash_value = DynamoType(key[table.hash_key_attr])
                range_attr = table.range_key_attr
                range_value = DynamoType(key[range_attr]) if range_attr and range_attr in key else None
                if range_attr and range_value is None:
                    continue
                current = table.get_item(hash_value, range_value)
                snapshot.append((table, hash_value, range_value, copy.deepcopy(current)))
            try:
                original(self, transact_items)
            except BaseException:
                for table, hash_value, range_value, old in reversed(snapshot):
                    _restore(table, hash_value, range_value, old)
                    _reindex(table, hash_value, range_value)
                raise

        transact.rollouts_patched = True  # type: ignore[attr-defined]
        models.copy = _TablesNotCopied  # type: ignore[assignment,attr-defined]
        models.DynamoDBBackend.transact_write_items = transact  # type: ignore[method-assign]


def _restore(table: Any, hash_value: Any, range_value: Any, old: Any) -> None:
    """Put one item of a moto table back as it was (`old` None: the item did not exist)."""
    if range_value is None:
        if old is None:
            table.items.pop(hash_value, None)
        else:
            table.items[hash_value] = old
        return
    if old is None:
        if hash_value in table.items:
            table.items[hash_value].pop(range_value, None)
    else:
        table.items[hash_value][range_value] = old


# ------------------------------------------------------------------------------------------ indexed queries


class _Buckets:
    """The primary keys of a moto table's items by the value of one attribute (an index's partition key)."""

    def __init__(self, attr: str) -> None:
        self.attr = attr
        self.by_value: dict[tuple[str, Any], dict[tuple[Any, Any], None]] = {}
        self.value_of: dict[tuple[Any, Any], tuple[str, Any]] = {}

    def update(self, key: tuple[Any, Any], item: Any) -> None:
        """Record the current `item` (None: gone) stored under primary `key`."""
        old = self.value_of.pop(key, None)
        if old is not None:
            bucket = self.by_value[old]
            del bucket[key]
            if not bucket:
                del self.by_value[old]
        value = item.attrs.get(self.attr) if item is not None else None
        if value is not None and value.type in _KEY_TYPES:
            new = (value.type, value.cast_value)
            self.by_value.setdefault(new, {})[key] = None
            self.value_of[key] = new


def _stored(table: Any, hash_value: Any, range_value: Any) -> Any:
    """The item stored under a primary key, or None; never creates a partition (`table.items` is a defaultdict)."""
    partition = table.items.get(hash_value)
    if partition is None or table.range_key_attr is None:
        return partition
    return partition.get(range_value)


def _reindex(table: Any, hash_value: Any, range_value: Any) -> None:
    """Bring every bucket of `table` up to date with the item now stored under (hash_value, range_value)."""
    buckets: dict[str, _Buckets] | None = getattr(table, _BUCKETS_ATTR, None)
    if not buckets:
        return
    if table.range_key_attr is None:
        range_value = None
    with _index_lock:
        item = _stored(table, hash_value, range_value)
        for bucket in buckets.values():
            bucket.update((hash_value, range_value), item)


def _buckets_for(table: Any, attr: str) -> _Buckets:
    """The buckets of `table` by `attr`, built from every item the first time they are asked for."""
    with _index_lock:
        buckets: dict[str, _Buckets] | None = table.__dict__.get(_BUCKETS_ATTR)
        if buckets is None:
            buckets = {}
            setattr(table, _BUCKETS_ATTR, buckets)
        found = buckets.get(attr)
        if found is None:
            found = buckets[attr] = _Buckets(attr)
            for hash_value, partition in list(table.items.items()):
                if table.range_key_attr is None:
                    found.update((hash_value, None), partition)
                else:
                    for range_value, item in list(partition.items()):
                        found.update((hash_value, range_value), item)
        return found


def _key_of(table: Any, attrs: Any) -> tuple[Any, Any] | None:
    """The primary key (hash, range) of a wire-format item or key, or None when it does not name one."""
    from moto.dynamodb.models.dynamo_type import DynamoType

    try:
        hash_value = DynamoType(attrs[table.hash_key_attr])
        range_attr = table.range_key_attr
        return hash_value, DynamoType(attrs[range_attr]) if range_attr else None
    except (KeyError, TypeError, AttributeError):
        return None


class _Candidates:
    """A moto table as its `query` sees it, but whose `all_items` are only the items that can match."""

    def __init__(self, table: Any, items: list[Any]) -> None:
        self._table = table
        self._items = items

    def __getattr__(self, name: str) -> Any:
        return getattr(self._table, name)

    def all_items(self) -> list[Any]:
        return self._items


def _query_candidates(
    table: Any, hash_key: Any, index_name: str | None, hash_key_conditions: list[tuple[str, Any]] | None
) -> list[Any] | None:
    """Every item of `table` a query can return (a superset of moto's own selection), or None to let moto scan.

    moto selects by reading and sorting every item of the table for each query (page), then keeping those whose
    partition key (of the table or of the index) equals the query's; here that selection starts from the table's
    partition, or from a bucket of items by the index's partition key value. moto's own code then does everything
    else as before (sort key conditions, order, pages, filters, projections, counts).
    """
    if index_name is None:
        attr, value = table.hash_key_attr, hash_key
    elif hash_key_conditions and len(hash_key_conditions) == 1:
        attr, value = hash_key_conditions[0]
    else:
        return None  # a multi-attribute index key: moto's own scan
    if value is None or value.type not in _KEY_TYPES:
        return None
    if attr == table.hash_key_attr:
        partition = table.items.get(value)
        if partition is None:
            return []
        return [partition] if table.range_key_attr is None else list(partition.values())
    with _index_lock:
        keys = list(_buckets_for(table, attr).by_value.get((value.type, value.cast_value), ()))
    items = (_stored(table, hash_value, range_value) for hash_value, range_value in keys)
    return [item for item in items if item is not None]


def _within_sort_key(items: list[Any], comparison: str | None, bounds: list[Any] | None) -> list[Any]:
    """The items of a table partition whose sort key meets the query's key condition (moto's own comparison), plus
    the nearest item on each side of them: moto sorts its candidates before it applies the condition (a batch
    partition holds every rollout of the batch, so a `begins_with` Query of its few counters sorted thousands of
    items, ~50 ms at 4,500), and it ends a full page with a LastEvaluatedKey when any candidate follows. The items
    a key condition selects are consecutive in sort key order, so these are all moto's answer depends on."""
    if not comparison:
        return items
    from moto.dynamodb.comparisons import get_comparison_func

    matches = get_comparison_func(comparison)
    values = [bound.cast_value for bound in bounds or []]
    inside = [item for item in items if item.range_key is not None and matches(item.range_key.cast_value, *values)]
    if not inside:
        return inside
    low = min(item.range_key.cast_value for item in inside)
    high = max(item.range_key.cast_value for item in inside)
    below: Any = None
    above: Any = None
    for item in items:
        value = item.range_key.cast_value if item.range_key is not None else None
        if value is None or low <= value <= high:
            continue
        if value < low and (below is None or value > below.range_key.cast_value):
            below = item
        elif value > high and (above is None or value < above.range_key.cast_value):
            above = item
    return inside + [item for item in (below, above) if item is not None]


@contextmanager
def unpatched_queries() -> Iterator[None]:
    """Run moto's own Query (a scan of the table) in this thread for the block: the reference the tests compare to."""
    _unpatched_queries.active = True
    try:
        yield
    finally:
        _unpatched_queries.active = False


def indexed_moto_queries() -> None:
    """Make moto's Query cost O(items in the partition queried), not O(table size), with the same answers.

    moto 5.2.5 answers every Query (every page of it) by sorting all the table's items and keeping those of the
    queried partition, so the sweeper's queries on the ledger's deadline and outbox indexes, and every query of a
    batch partition, got slower with every item the ledger held. A table query now starts from its partition's items
    that meet its sort key condition; an
    index query from a bucket of the items whose value of the index's partition key matches, kept up to date on
    every write moto makes (PutItem, UpdateItem, DeleteItem and the writes in transactions, batches and PartiQL
    go through the hooked methods; a cancelled transaction's restored items are re-indexed) and built from the whole
    table the first time an attribute is queried. Idempotent; a no-op (with a warning) on another moto version than
    `PATCHED_MOTO_VERSION`.
    """
    from moto.dynamodb.models import DynamoDBBackend
    from moto.dynamodb.models.table import Table

    with _patch_lock:
        if getattr(Table.query, "rollouts_patched", False):
            return
        if _refuse_other_moto("indexed_moto_queries"):
            return
        moto_query: Any = Table.query
        moto_put = Table.put_item
        moto_delete = Table.delete_item
        moto_update = DynamoDBBackend.update_item
        query_signature = inspect.signature(moto_query)

        def query(self: Any, hash_key: Any, *args: Any, **kwargs: Any) -> Any:
            if getattr(_unpatched_queries, "active", False):
                return moto_query(self, hash_key, *args, **kwargs)
            bound = query_signature.bind(self, hash_key, *args, **kwargs).arguments
            candidates = _query_candidates(self, hash_key, bound.get("index_name"), bound.get("hash_key_conditions"))
            if candidates is None:
                return moto_query(self, hash_key, *args, **kwargs)
            if bound.get("index_name") is None:
                candidates = _within_sort_key(candidates, bound.get("range_comparison"), bound.get("range_objs"))
            return moto_query(_Candidates(self, candidates), hash_key, *args, **kwargs)

        def put_item(self: Any, item_attrs: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
            try:
                return moto_put(self, item_attrs, *args, **kwargs)
            finally:
                key = _key_of(self, item_attrs)
                if key is not None:
                    _reindex(self, *key)

        def delete_item(self: Any, hash_key: Any, range_key: Any) -> Any:
            try:
                return moto_delete(self, hash_key, range_key)
            finally:
                _reindex(self, hash_key, range_key)

        def update_item(self: Any, table_name: str, key: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
            try:
                return moto_update(self, table_name, key, *args, **kwargs)
            finally:
                table = self.tables.get(table_name)
                found = _key_of(table, key) if table is not None else None
                if found is not None:
                    _reindex(table, *found)

        for patched in (query, put_item, delete_item, update_item):
            setattr(patched, "rollouts_patched", True)  # noqa: B010 (a function attribute mypy does not know)
        Table.query = query  # type: ignore[method-assign]
        Table.put_item = put_item  # type: ignore[method-assign]
        Table.delete_item = delete_item  # type: ignore[method-assign]
        DynamoDBBackend.update_item = update_item  # type: ignore[method-assign]


class PortInUse(RuntimeError):
    """The local AWS endpoint's port is taken; the message says what to do."""


def ensure_port_free(port: int) -> None:
    """Raise `PortInUse` when something listens on `LOOPBACK:port` (as werkzeug would bind it), before werkzeug
    prints its own message and exits the process."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((LOOPBACK, port))
        except OSError as exc:
            raise PortInUse(
                f"port {port} of {LOOPBACK} is in use ({exc.strerror or exc}): probably another `rollouts local up` "
                f"is running there (its endpoint: http://{LOOPBACK}:{port}); use that one, stop it, or start this "
                "one on another port with --port N (--port 0: any free port)"
            ) from None


def backend_dispatcher() -> Any:
    """moto's server application (`DomainDispatcherApplication`), finding each request's backend once per host.

    For every request moto finds the backend from the host (a signed request's service and region) by listing its
    own package's folders (a stat of each of its ~150 service folders) and matching its URL patterns, under a lock
    every request takes: 0.7 ms of CPU a request, about a tenth of local mode's. The answer depends on the host alone
    (the installed moto does not change while it runs), so it is kept.
    """
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app

    app = DomainDispatcherApplication(create_backend_app)
    app.get_backend_for_host = functools.cache(app.get_backend_for_host)  # type: ignore[method-assign]
    return app


@contextmanager
def moto_server(port: int | None = None) -> Iterator[str]:
    """Start a moto server on 127.0.0.1 (threaded; DynamoDB and EventBridge serialised; AgentCore's
    StopRuntimeSession served by the local runtime registered for it: `local.acr_endpoint`); yield its endpoint URL;
    stop it on exit."""
    import logging

    from moto.moto_server.werkzeug_app import MotoRequestHandler
    from werkzeug.serving import make_server

    from rollout_pipeline.local.acr_endpoint import AgentCoreEndpoint

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one access-log line per AWS call otherwise
    if port:
        ensure_port_free(port)
    patch_moto()
    agentcore = AgentCoreEndpoint(backend_dispatcher())
    app = SerializedServices(agentcore)
    server = make_server(LOOPBACK, port or free_port(), app, threaded=True, request_handler=MotoRequestHandler)
    agentcore.endpoint_url = endpoint_url = f"http://{LOOPBACK}:{server.server_port}"
    thread = threading.Thread(target=server.serve_forever, name="moto-server", daemon=True)
    thread.start()
    try:
        yield endpoint_url
    finally:
        server.shutdown()
        thread.join(10)


@contextmanager
def patched_environ(values: dict[str, str]) -> Iterator[None]:
    """Set environment variables for the duration of the block, restoring the previous values after."""
    previous = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, old in previous.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old
