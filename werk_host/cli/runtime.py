"""``werk runtime …``: the Werk Protocol control plane of a running ``werk serve`` through
:class:`~werk_host.client.WerkProtocolClient` (docs/cli.md, "werk runtime").

Commands (every ``/werk/v1`` route)::

    werk runtime info | capabilities | memory | observability | deployments
    werk runtime states list | action | prune
    werk runtime experts list | action
    werk runtime prefill | decode
    werk runtime count-tokens | admission | limits | reasoning

Contracts: every command takes the connection options of :mod:`werk_host.cli.connection`
(``--server``, ``--timeout``, ``--deployment``; the key from ``WERK_API_KEY`` or a prompt, never
argv) and ``--json``. Success prints text on stdout (tables for ``states list``,
``experts list`` and ``capabilities``, ``key: value`` lines otherwise) or, with ``--json``, the
result as pretty JSON; exit 0. A failure prints one line ``werk: <problem> (<fix>)`` on stderr
(the JSON error object under ``--json``) and exits with the code for its class
(:data:`EXIT_CODES`, documented in docs/cli.md, "Output and exit codes"). Mutations are
previews (``dry_run: true``) unless ``--execute``. Handoffs never reach the terminal: they live
only in owner-only files (:mod:`werk_host.cli.handoffs`).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ValidationError

from werk_host.cli.arguments import KEY_ENV, RefuseKeyOnArgv
from werk_host.cli.connection import (
    EXIT_CODES,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    SERVER_ENV,
    HandoffFileError,
    InputError,
    client_for,
    connection_options,
    describe_error,
    emit_error,
    exit_code_for,
    server_of,
    with_scheme,
)
from werk_host.cli.handoffs import (
    SecretFile,
    handoff_note,
    read_handoff_file,
    read_input_file,
    replace_secret_file,
)
from werk_host.cli.output import add_json_flag, emit
from werk_host.cli.runtime_text import (
    Text,
    capabilities_text,
    deployments_text,
    experts_text,
    preview_text,
    states_text,
)
from werk_host.client import WerkClientError
from werk_host.protocol import (
    DEFAULT_OUTPUT_TOKENS,
    AllSelector,
    ChatRequest,
    DecodeRequest,
    ExpertActionKind,
    ExpertActionRequest,
    ExpertListQuery,
    ExpertTier,
    FilterSelector,
    IdsSelector,
    MessagesInput,
    PersistenceMode,
    Policy,
    PrefillRequest,
    PruneRequest,
    ReusePolicy,
    StateActionKind,
    StateActionRequest,
    StateListQuery,
    TextInput,
    Tier,
)

#: Names other modules import from here (the connection layer lives in its own module).
__all__ = [
    "EXIT_CODES",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_USAGE",
    "KEY_ENV",
    "SERVER_ENV",
    "HandoffFileError",
    "InputError",
    "RefuseKeyOnArgv",
    "client_for",
    "connection_options",
    "describe_error",
    "emit_error",
    "exit_code_for",
    "read_handoff_file",
    "register",
    "server_of",
    "with_scheme",
]


def _dump(value: BaseModel | list[Any]) -> Any:
    if isinstance(value, list):
        return [_dump(v) for v in value]
    return value.model_dump(mode="json")


def _validation_summary(err: ValidationError) -> str:
    parts = []
    for item in err.errors(include_input=False, include_url=False, include_context=False)[:5]:
        loc = ".".join(str(p) for p in item.get("loc", ())) or "value"
        parts.append(f"{loc}: {item.get('msg', 'invalid')}")
    return "; ".join(parts)


def _build(factory: Callable[[], Any]) -> Any:
    """Run a DTO constructor, turning validation errors into :class:`InputError` (no values echoed)."""
    try:
        return factory()
    except ValidationError as err:
        raise InputError(f"invalid input: {_validation_summary(err)}") from None


# -- commands ----------------------------------------------------------------------------
def _simple(method: str) -> Callable[[argparse.Namespace], Any]:
    def run(args: argparse.Namespace) -> Any:
        return _dump(getattr(client_for(args), method)())

    return run


def cmd_states_list(args: argparse.Namespace) -> Any:
    query = _build(lambda: StateListQuery(model_id=args.model_id, tier=args.tier, limit=args.limit, cursor=args.cursor))
    return _dump(client_for(args).list_states(query))


def cmd_states_action(args: argparse.Namespace) -> Any:
    request = _build(
        lambda: StateActionRequest(
            action=args.action,
            target_tier=args.target_tier,
            dry_run=not args.execute,
            allow_experimental=args.allow_experimental,
        )
    )
    return _dump(client_for(args).state_action(args.state_id, request))


def cmd_states_prune(args: argparse.Namespace) -> Any:
    filtered = any(v is not None for v in (args.model_id, args.tier, args.older_than_unix_ms))
    selector: Any
    if args.all:
        if filtered or args.ids:
            raise InputError("--all cannot be combined with --id or filter options")
        selector = _build(lambda: AllSelector(kind="all", confirm=True))
    elif args.ids:
        if filtered:
            raise InputError("--id cannot be combined with filter options")
        selector = _build(lambda: IdsSelector(kind="ids", ids=args.ids))
    else:
        if not filtered:
            raise InputError("choose --id, --all, or at least one of --model-id, --tier, --older-than-unix-ms")
        selector = _build(
            lambda: FilterSelector(
                kind="filter", model_id=args.model_id, tier=args.tier, older_than_unix_ms=args.older_than_unix_ms
            )
        )
    request = _build(lambda: PruneRequest(selector=selector, dry_run=not args.execute))
    return _dump(client_for(args).prune_states(request))


def cmd_experts_list(args: argparse.Namespace) -> Any:
    query = _build(
        lambda: ExpertListQuery(
            model_id=args.model_id,
            tier=args.tier,
            limit=args.limit,
            cursor=args.cursor,
            allow_experimental=args.allow_experimental,
        )
    )
    return _dump(client_for(args).list_experts(query))


def cmd_experts_action(args: argparse.Namespace) -> Any:
    request = _build(
        lambda: ExpertActionRequest(
            model_id=args.model_id,
            expert_ids=args.expert_ids,
            action=args.action,
            target_tier=args.target_tier,
            dry_run=not args.execute,
            allow_experimental=args.allow_experimental,
        )
    )
    return _dump(client_for(args).expert_action(request))


def _messages(path: str) -> list[Any]:
    loaded = read_input_file(path, "messages file")
    if isinstance(loaded, dict) and set(loaded) == {"messages"}:
        loaded = loaded["messages"]
    if not isinstance(loaded, list):
        raise InputError('the messages file must hold a JSON array of messages or {"messages": [...]}')
    return loaded


def cmd_prefill(args: argparse.Namespace) -> Any:
    prefill_input: Any
    if args.messages_file is not None:
        messages = _messages(args.messages_file)
        prefill_input = _build(lambda: MessagesInput(type="messages", messages=messages))
    else:
        prefill_input = _build(lambda: TextInput(type="text", text=args.text))
    policy = None
    if args.mode is not None or args.reuse is not None or args.ttl_seconds is not None or args.pin:
        policy = _build(
            lambda: Policy(
                mode=args.mode or PersistenceMode.AUTO,
                reuse=args.reuse or ReusePolicy.PREFER,
                ttl_seconds=args.ttl_seconds,
                pin=args.pin,
            )
        )
    request = _build(
        lambda: PrefillRequest(
            model_id=args.model, input=prefill_input, policy=policy, allow_experimental=args.allow_experimental
        )
    )
    client = client_for(args)
    holder = SecretFile(args.handoff_file)
    try:
        result = client.prefill(request)
    except BaseException:
        holder.discard()
        raise
    holder.write(result.handoff.get_secret_value())
    out = result.model_dump(mode="json", exclude={"handoff"})
    out["handoff"] = handoff_note(args.handoff_file)
    return out


def cmd_decode(args: argparse.Namespace) -> Any:
    handoff = read_handoff_file(args.handoff_file)
    request = _build(
        lambda: DecodeRequest(
            handoff=handoff,
            max_tokens=args.max_tokens,
            temperature=args.temperature,
            top_p=args.top_p,
            seed=args.seed,
            stop=args.stop,
            allow_experimental=args.allow_experimental,
        )
    )
    client = client_for(args)
    holder = SecretFile(args.next_handoff_file) if args.next_handoff_file else None
    try:
        result = client.decode(request)
    except BaseException:
        if holder is not None:
            holder.discard()
        raise
    out = result.model_dump(mode="json", exclude={"handoff"})
    out["handoff"] = None
    if result.handoff is None:
        if holder is not None:
            holder.discard()
    elif holder is not None:
        holder.write(result.handoff.get_secret_value())
        out["handoff"] = handoff_note(args.next_handoff_file)
    else:
        replace_secret_file(args.handoff_file, result.handoff.get_secret_value())
        out["handoff"] = handoff_note(args.handoff_file)
    return out


def _chat_request(args: argparse.Namespace) -> ChatRequest:
    if args.request_file is not None:
        loaded = read_input_file(args.request_file, "request file")
        if not isinstance(loaded, dict):
            raise InputError("the request file must hold a JSON object (an OpenAI chat request)")
        if args.model is not None:
            loaded["model"] = args.model
        if args.max_tokens is not None:
            loaded["max_tokens"] = args.max_tokens
        return _build(lambda: ChatRequest.model_validate(loaded))  # type: ignore[no-any-return]
    messages: list[Any] = (
        _messages(args.messages_file) if args.messages_file is not None else [{"role": "user", "content": args.text}]
    )
    fields: dict[str, Any] = {"messages": messages}
    if args.model is not None:
        fields["model"] = args.model
    if args.max_tokens is not None:
        fields["max_tokens"] = args.max_tokens
    return _build(lambda: ChatRequest.model_validate(fields))  # type: ignore[no-any-return]


def cmd_count_tokens(args: argparse.Namespace) -> Any:
    return _dump(client_for(args).count_tokens(_chat_request(args)))


def cmd_admission(args: argparse.Namespace) -> Any:
    return _dump(client_for(args).admission(_chat_request(args)))


def cmd_limits(args: argparse.Namespace) -> Any:
    return _dump(client_for(args).chat_limits(args.model))


def cmd_reasoning(args: argparse.Namespace) -> Any:
    return _dump(client_for(args).reasoning(args.model, args.max_output_tokens))


# -- parser ------------------------------------------------------------------------------
def _dispatch(command: Callable[[argparse.Namespace], Any], text: Text | None) -> Callable[[argparse.Namespace], int]:
    def handler(args: argparse.Namespace) -> int:
        try:
            result = command(args)
        except (WerkClientError, InputError, HandoffFileError) as err:
            emit_error(err, args)
            return exit_code_for(err)
        except KeyboardInterrupt:
            return EXIT_INTERRUPTED
        emit(args, result, None if text is None else text(result))
        return EXIT_OK

    return handler


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError("expected an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError("expected a positive integer")
    return value


def _execute_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--execute", action="store_true", help="act for real; without it the server only previews (dry_run)"
    )


def _experimental_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--allow-experimental", action="store_true", help="opt in to an experimental capability")


def register(subparsers: Any) -> None:
    """Add ``werk runtime …`` to the ``werk`` command's sub-parsers."""
    common = connection_options()
    codes = "\n".join(f"  {code:<4} {cls.__name__}" for cls, code in sorted(EXIT_CODES.items(), key=lambda kv: kv[1]))
    runtime = subparsers.add_parser(
        "runtime",
        help="drive the Werk Protocol control plane of a running server",
        description="Drive the Werk Protocol 1.0 control plane of a running werk serve. Mutations are "
        "previews unless --execute is given; handoffs only ever live in owner-only files.",
        epilog="Success prints text (--json: the result as JSON) and exits 0; a failure prints one line "
        "werk: <problem> (<fix>) on stderr (--json: a JSON error object) and exits with the code for its "
        f"class (docs/cli.md, Output and exit codes):\n{codes}\n  130  interrupted",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = runtime.add_subparsers(dest="runtime_command", required=True, metavar="COMMAND")

    def leaf(
        parent: Any, name: str, help_text: str, command: Callable[[argparse.Namespace], Any], text: Text | None = None
    ) -> Any:
        parser = parent.add_parser(name, help=help_text, parents=[common])
        add_json_flag(parser)
        parser.set_defaults(handler=_dispatch(command, text))
        return parser

    leaf(sub, "info", "runtime info and negotiated limits", _simple("info"))
    leaf(sub, "capabilities", "capability statuses", _simple("capabilities"), capabilities_text)
    leaf(sub, "memory", "memory telemetry and accounting", _simple("memory"))
    leaf(sub, "observability", "chat, worker and memory observations", _simple("observability"))
    leaf(sub, "deployments", "deployment inventory, plans and slots", _simple("deployments"), deployments_text)

    states = sub.add_parser("states", help="named runtime states")
    ssub = states.add_subparsers(dest="states_command", required=True, metavar="COMMAND")
    p = leaf(ssub, "list", "one page of states", cmd_states_list, states_text)
    p.add_argument("--model-id")
    p.add_argument("--tier", choices=[t.value for t in Tier])
    p.add_argument("--limit", type=_positive_int, default=100)
    p.add_argument("--cursor")
    p = leaf(
        ssub,
        "action",
        "pin, unpin, promote, demote or evict one state (preview unless --execute)",
        cmd_states_action,
        preview_text,
    )
    p.add_argument("state_id")
    p.add_argument("action", choices=[a.value for a in StateActionKind])
    p.add_argument("--target-tier", choices=[t.value for t in Tier])
    _experimental_flag(p)
    _execute_flag(p)
    p = leaf(ssub, "prune", "remove selected states (preview unless --execute)", cmd_states_prune, preview_text)
    p.add_argument("--id", dest="ids", action="append", metavar="STATE_ID", help="a state id (repeatable)")
    p.add_argument("--all", action="store_true", help="select every visible state")
    p.add_argument("--model-id")
    p.add_argument("--tier", choices=[t.value for t in Tier])
    p.add_argument("--older-than-unix-ms", type=int)
    _execute_flag(p)

    experts = sub.add_parser("experts", help="MoE expert residency")
    esub = experts.add_subparsers(dest="experts_command", required=True, metavar="COMMAND")
    p = leaf(esub, "list", "one page of expert metadata", cmd_experts_list, experts_text)
    p.add_argument("--model-id")
    p.add_argument("--tier", choices=[t.value for t in ExpertTier])
    p.add_argument("--limit", type=_positive_int, default=100)
    p.add_argument("--cursor")
    _experimental_flag(p)
    p = leaf(
        esub,
        "action",
        "prefetch, pin, unpin or evict experts (preview unless --execute)",
        cmd_experts_action,
        preview_text,
    )
    p.add_argument("action", choices=[a.value for a in ExpertActionKind])
    p.add_argument("--model-id", required=True)
    p.add_argument(
        "--expert-id",
        dest="expert_ids",
        action="append",
        required=True,
        metavar="EXPERT_ID",
        help="an expert id (repeatable)",
    )
    p.add_argument("--target-tier", choices=[t.value for t in Tier])
    _experimental_flag(p)
    _execute_flag(p)

    p = leaf(sub, "prefill", "prefill input; the handoff goes to an owner-only file", cmd_prefill)
    p.add_argument("--model", required=True, help="installed model id")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--text", help="text input")
    source.add_argument("--messages-file", help='JSON file with [{"role", "content"}, ...] ("-" = stdin)')
    p.add_argument("--handoff-file", required=True, help="new file (must not exist) to receive the handoff")
    p.add_argument("--mode", choices=[m.value for m in PersistenceMode])
    p.add_argument("--reuse", choices=[r.value for r in ReusePolicy])
    p.add_argument("--ttl-seconds", type=_positive_int)
    p.add_argument("--pin", action="store_true")
    p.add_argument(
        "--allow-experimental",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="explicit experimental opt-in (omitted: the server's default applies)",
    )

    p = leaf(sub, "decode", "decode from the handoff in an owner-only file", cmd_decode)
    p.add_argument("--handoff-file", required=True, help="owner-only file holding the handoff")
    p.add_argument(
        "--next-handoff-file", help="new file for a next handoff (default: replace the consumed one in --handoff-file)"
    )
    p.add_argument("--max-tokens", type=_positive_int, default=DEFAULT_OUTPUT_TOKENS)
    p.add_argument("--temperature", type=float)
    p.add_argument("--top-p", type=float)
    p.add_argument("--seed", type=int)
    p.add_argument("--stop", action="append", help="stop string (repeatable)")
    _experimental_flag(p)

    for name, help_text, command in (
        ("count-tokens", "exact native input token count of a chat request", cmd_count_tokens),
        ("admission", "planning budget of a chat request", cmd_admission),
    ):
        p = leaf(sub, name, help_text, command)
        chat_source = p.add_mutually_exclusive_group(required=True)
        chat_source.add_argument("--request-file", help='JSON OpenAI chat request ("-" = stdin)')
        chat_source.add_argument("--text", help="a single user message")
        chat_source.add_argument("--messages-file", help="JSON array of chat messages")
        p.add_argument("--model")
        p.add_argument("--max-tokens", type=_positive_int)

    p = leaf(sub, "limits", "context, output and concurrency limits", cmd_limits)
    p.add_argument("--model")
    p = leaf(sub, "reasoning", "reasoning profile and tiers", cmd_reasoning)
    p.add_argument("--model")
    p.add_argument("--max-output-tokens", type=_positive_int, default=DEFAULT_OUTPUT_TOKENS)
