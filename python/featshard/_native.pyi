"""Types of featshard's native module (Rust, PyO3)."""

from typing import Any

__version__: str

class Placement:
    """A sample validated and placed on a CP mesh by the byte executor."""

    def layout(self) -> Any: ...
    def features(self) -> list[tuple[str, str, list[int], list[int]]]: ...
    def buffer_offsets(self, compact: bool = False) -> tuple[list[tuple[str, int]], int]: ...
    def compact_forms(self) -> list[tuple[str, str, int, int, str, str]]: ...
    def passthrough(self) -> list[str]: ...
    def intake(self) -> tuple[list[str], dict[str, int], dict[str, int]]: ...
    def write_blocks(
        self, coord: tuple[int, int], outs: list[tuple[str, Any]], threads: int = 1
    ) -> None: ...
    def block_shapes(self, coord: tuple[int, int]) -> list[tuple[str, list[int]]]: ...
    def write_padded(self, outs: list[tuple[str, Any]], threads: int = 1) -> None: ...
    def write_serial(self, outs: list[tuple[str, Any]], threads: int = 1) -> None: ...
    def whole_shapes(self) -> list[tuple[str, list[int], list[int]]]: ...
    def rank_buffer(
        self, coord: tuple[int, int], threads: int = 1, compact: bool = False
    ) -> tuple[Any, list[tuple[str, int]]]: ...

class ShardManifest:
    """A pre-sharded sample's manifest, read and checked against the plan in Rust."""

    @property
    def run(self) -> str: ...
    @property
    def mesh(self) -> tuple[int, int]: ...
    @property
    def workflow(self) -> str | None: ...
    @property
    def layout_sha256(self) -> str: ...
    @property
    def metadata(self) -> dict[str, str]: ...
    def dtensor_shape(self, name: str) -> tuple[list[int], list[int]] | None: ...
    def check_rank(self, path: str, rank: int, entry: str | None) -> None: ...
    def verify_file(self, name: str, path: str) -> None: ...

class Plan:
    """A compiled spec: its Plan IR and the geometry of any sample on any mesh."""

    def read_manifest(self, path: str) -> ShardManifest: ...

    @staticmethod
    def from_file(path: str) -> Plan: ...
    @staticmethod
    def from_json(text: str) -> Plan: ...
    @property
    def module(self) -> str: ...
    @property
    def sha256(self) -> str: ...
    def repad_strides(
        self, name: str, local: dict[str, list[int]], target: dict[str, list[int]]
    ) -> tuple[int, int] | None: ...
    def collated_shape(
        self, name: str, local: list[int], batch: int, dp: int, cp: tuple[int, int]
    ) -> list[int]: ...
    def json(self) -> str: ...
    def pad_multiple(self, semantic: str, mesh: tuple[int, int]) -> int: ...
    def padded_length(self, semantic: str, len: int, mesh: list[int]) -> int: ...
    def domain_window(
        self, feature: str, global_: list[int], mesh: list[int], coord: list[int]
    ) -> list[tuple[int, int]]: ...
    def place(
        self,
        features: dict[str, Any],
        mesh: tuple[int, int],
        workflow: str | None = None,
        passthrough: set[str] = ...,
        threads: int = 1,
    ) -> Placement: ...
    def layout(
        self,
        mesh: list[int],
        sizes: dict[str, int],
        counts: dict[str, list[int]] = ...,
        owners: dict[str, list[int]] = ...,
    ) -> Any: ...
    def shapes(
        self, layout: Any, names: list[str]
    ) -> dict[str, tuple[list[int], list[int], list[int], list[int]]]: ...
    def ir(self) -> dict[str, Any]: ...
    def check_shapes(self, shapes: dict[str, tuple[str, list[int]]]) -> dict[str, int]: ...
    def read_dataset(self, path: str, mesh: tuple[int, int]) -> list[str]: ...
    def block_window(
        self, feature: str, local: list[int], coord: tuple[int, int]
    ) -> list[tuple[int, int]]: ...

def main(argv: list[str]) -> int:
    """Run the featshard command line ``argv`` (program name first); its exit status."""

def plan_json(path: str) -> str:
    """The Plan IR of the spec file at ``path``, as JSON; ``ValueError`` on a spec error."""

def plan_ir(path: str) -> dict[str, Any]:
    """The Plan IR of the spec file at ``path``, as dicts and lists."""

def read_header(
    path: str,
) -> tuple[list[tuple[str, str, list[int], int]], dict[str, str]]:
    """A safetensors file's checked header: ``(name, dtype, shape, file offset)`` per
    tensor, sorted by name, and its ``__metadata__``."""

def chunk_sizes(len: int, ranks: int) -> list[int]:
    """The ``torch.chunk`` pieces of ``len`` items over ``ranks``; ``ValueError`` when a
    shard would be empty."""

def coords(mesh: tuple[int, int], rank: int) -> tuple[int, int]:
    """The CP mesh coordinate of ``rank``."""

def contiguous_stride(shape: list[int]) -> list[int]:
    """Row-major strides (in elements) of a tensor of ``shape``."""

def repad_indices(values: list[int], old: int, new: int) -> list[int]:
    """Owner-block positions moved to a larger per-block stride; negatives stay."""

def replica_indices(
    n: int,
    dp: int,
    replica: int,
    *,
    epoch: int = 0,
    seed: int | None = None,
    drop_last: bool = False,
) -> list[int]:
    """The samples DP replica ``replica`` of ``dp`` reads in ``epoch``, in order."""
