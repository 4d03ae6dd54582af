"""``python -m floodwall``: the command line."""

try:
    from floodwall.cli import main
except ImportError as exc:  # pragma: no cover - only without the cli extra
    raise SystemExit(
        f"the floodwall command needs the cli extra: pip install 'floodwall[cli]' ({exc})"
    ) from exc

main()
