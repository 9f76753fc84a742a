"""Types of featshard's native module (Rust, PyO3)."""

__version__: str

def main(argv: list[str]) -> int:
    """Run the featshard command line ``argv`` (program name first); its exit status."""

def plan_json(path: str) -> str:
    """The Plan IR of the spec file at ``path``, as JSON; ``ValueError`` on a spec error."""
