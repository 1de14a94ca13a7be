"""Typed model of a kernel manifest (kernels.yaml), validated on load.

The manifest is the only place a kernel's argument layout is written: the builder
generates the assembly's kernarg symbols, kernel descriptor and metadata from it, the
launcher packs arguments by it, and `gfxasm check` compares it with every built `.co`.
The schema is documented at the top of kernels.yaml. Every error names the file, the
kernel and the field.
"""
from __future__ import annotations

import functools
import importlib.resources
import keyword
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import yaml

from .gridexpr import FUNCTIONS, GridExpr, GridExprError
from .kernarg import ARG_TYPES, ArgType, layout
from .symbols import GENERATED_SYMBOLS, KERNARG_SYMBOL_PREFIX

REPO_ROOT = Path(__file__).resolve().parent.parent

LDS_LIMIT_BYTES = 160 * 1024      # gfx950: 160 KiB of LDS per workgroup
MAX_WORKGROUP_SIZE = 1024
DIRECTIONS = ("in", "out", "inout")
# `launch(kernel, variant=..., **args)` takes the variant by keyword, so no argument may use it.
RESERVED_ARG_NAMES = frozenset({"variant"}) | frozenset(FUNCTIONS)

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_SYMBOL = re.compile(r"[A-Za-z_.][A-Za-z0-9_.$]*\Z")


class ManifestError(ValueError):
    pass


def packaged_data() -> Path:
    """gfxasm/data of an installed package: kernels.yaml, asm/ and the prebuilt build/*.co."""
    data = importlib.resources.files(__package__) / "data"
    if not isinstance(data, Path):     # a zipped install: code objects are opened by path
        raise ManifestError(f"gfxasm is installed as an archive ({data}); install it unzipped")
    return data


def _default_manifest_path() -> Path:
    """$GFXASM_MANIFEST; else the checkout's kernels.yaml next to this package's source (an
    editable install: its build/ wins while developing); else the one installed with the
    package from the wheel."""
    override = os.environ.get("GFXASM_MANIFEST")
    if override:
        return Path(override).resolve()
    checkout = REPO_ROOT / "kernels.yaml"
    return checkout if checkout.is_file() else packaged_data() / "kernels.yaml"


DEFAULT_MANIFEST = _default_manifest_path()


@dataclass(frozen=True)
class Arg:
    name: str
    type: ArgType
    direction: str                             # in / out / inout
    offset: int                                # byte offset in the kernarg segment
    shape: tuple[str | int, ...] | None = None  # dims: names bind across args, ints are exact
    rank: int | None = None                    # set by `shape` or by `rank`
    contiguous: bool = True
    numel: GridExpr | None = None              # rank-only buffers: elements the kernel may touch
    strides: tuple[str | int, ...] | None = None  # per dim: u32/i32/u64 scalar with its byte stride, or elements

    def describe(self) -> str:
        """'x: *f32 in [rows, cols]' — as `gfxasm list` and argument errors show it."""
        if self.shape is not None:
            dims = f" [{', '.join(map(str, self.shape))}]"
        else:
            dims = f" (rank {self.rank})" if self.rank is not None else ""
        layout = "" if self.contiguous or not self.type.is_pointer else " strided"
        if self.strides is not None:
            layout = f" strides [{', '.join(map(str, self.strides))}]"
        size = f" numel >= {self.numel.text}" if self.numel is not None else ""
        return f"{self.name}: {self.type.name} {self.direction}{dims}{layout}{size}"


@dataclass(eq=False)
class Variant:
    name: str
    kernel: "Kernel" = field(repr=False)
    defines: dict[str, int]
    args: tuple[Arg, ...]
    kernarg_size: int

    @property
    def co_path(self) -> Path:
        return self.kernel.manifest.build_dir / f"{self.name}.co"

    def arg(self, name: str) -> Arg:
        for arg in self.args:
            if arg.name == name:
                return arg
        raise KeyError(f"variant '{self.name}' has no argument '{name}'")


@dataclass(eq=False)
class Kernel:
    name: str
    manifest: "Manifest" = field(repr=False)
    source: Path                               # absolute
    symbol: str
    workgroup: tuple[int, int, int]
    lds_bytes: int
    grid: tuple[GridExpr, GridExpr, GridExpr]
    float_denorm_mode_32: int
    description: str = ""
    variants: dict[str, Variant] = field(default_factory=dict)
    # "serial" (any order of workgroups gives the result) or "concurrent": its workgroups wait
    # on each other through global memory (a grid-wide flag), which the emulator runs only
    # under Kernel.launch(schedule="concurrent"); on hardware the launch is the same (the
    # co-residency the kernel relies on is the kernel's to state and order, see SCHEDULES)
    schedule: str = "serial"

    def variant(self, name: str | None = None) -> Variant:
        if name is None:
            if len(self.variants) == 1:
                return next(iter(self.variants.values()))
            raise ValueError(f"kernel '{self.name}' has variants {', '.join(self.variants)}: "
                             f"pass variant=")
        try:
            return self.variants[name]
        except KeyError:
            raise ValueError(f"kernel '{self.name}' has no variant '{name}'; "
                             f"it has: {', '.join(self.variants)}") from None

    def variant_with(self, **defines: int) -> Variant:
        """The one variant whose defines have these values (the source's own switches pick
        it, so an op never spells a variant's name)."""
        found = [v for v in self.variants.values()
                 if all(v.defines.get(name, 0) == int(value) for name, value in defines.items())]
        if len(found) != 1:
            wanted = ", ".join(f"{name}={int(value)}" for name, value in defines.items())
            raise ValueError(f"kernel '{self.name}': {len(found)} variants have {wanted} "
                             f"({', '.join(v.name for v in found) or 'none'}); expected exactly one")
        return found[0]


@dataclass(eq=False)
class Manifest:
    path: Path
    build_dir: Path
    include_dirs: tuple[Path, ...]
    cases: Path | None                         # Python file registering `gfxasm run` cases
    kernels: dict[str, Kernel] = field(default_factory=dict)
    prebuilt: bool = False                     # installed with the package: never assembled

    @property
    def build_hint(self) -> str:
        """What to do about a missing code object."""
        if self.prebuilt:
            return ("the installed gfxasm package lacks it: reinstall a wheel built after ./build.sh, "
                    "or set GFXASM_BUILD_DIR to a folder holding the .co files")
        return "run ./build.sh"

    @property
    def root(self) -> Path:
        return self.path.parent

    def kernel(self, name: str) -> Kernel:
        try:
            return self.kernels[name]
        except KeyError:
            known = ", ".join(self.kernels) or "none"
            raise ValueError(f"{self.path} has no kernel '{name}'; it has: {known}") from None

    def variants(self) -> Iterator[Variant]:
        for kernel in self.kernels.values():
            yield from kernel.variants.values()

    @classmethod
    def load(cls, path: str | Path) -> "Manifest":
        return _Parser(Path(path)).manifest()


@functools.lru_cache(maxsize=None)
def default_manifest() -> Manifest:
    """The product manifest, DEFAULT_MANIFEST (loading it applies $GFXASM_BUILD_DIR)."""
    return Manifest.load(DEFAULT_MANIFEST)


# --- YAML with duplicate keys refused (PyYAML silently keeps the last one) ---

class _StrictLoader(yaml.SafeLoader):
    pass


def _mapping_without_duplicates(loader: _StrictLoader, node: yaml.MappingNode) -> dict:
    seen = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)
        if key in seen:
            raise ManifestError(f"{loader.name}:{key_node.start_mark.line + 1}: duplicate key '{key}'")
        seen.add(key)
    return loader.construct_mapping(node)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_without_duplicates)


# --- validation ---

_TOP_FIELDS = {"build_dir", "include_dirs", "cases", "kernels"}
_KERNEL_FIELDS = {"description", "source", "symbol", "workgroup", "lds_bytes", "grid",
                  "float_denorm_mode_32", "schedule", "args", "variants"}
# A kernel whose workgroups wait on other workgroups (schedule: concurrent) is only safe on
# hardware when every workgroup it waits for is resident or finishes without waiting: such a
# kernel puts its producers at the lowest workgroup ids (dispatched first) and never waits in
# a producer, so no producer can be held out by a waiting consumer.
SCHEDULES = ("serial", "concurrent")
_ARG_FIELDS = {"name", "type", "dir", "shape", "rank", "contiguous", "numel", "strides"}
_VARIANT_FIELDS = {"defines", "types"}


class _Parser:
    def __init__(self, path: Path):
        self.path = path

    def fail(self, kernel: str | None, where: str, message: str) -> ManifestError:
        place = f"kernel '{kernel}': " if kernel else ""
        return ManifestError(f"{self.path}: {place}field '{where}': {message}")

    def manifest(self) -> Manifest:
        if not self.path.is_file():
            raise ManifestError(f"{self.path}: manifest file not found")
        try:
            with open(self.path) as stream:
                loader = _StrictLoader(stream)
                loader.name = str(self.path)
                try:
                    data = loader.get_single_data() or {}
                finally:
                    loader.dispose()
        except yaml.YAMLError as exc:
            raise ManifestError(f"{self.path}: not valid YAML: {exc}") from None
        self.mapping(data, None, "", _TOP_FIELDS, required={"kernels"})
        root = self.path.resolve().parent
        cases = data.get("cases")
        build_dir = root / self.string(data.get("build_dir", "build"), None, "build_dir")
        if os.environ.get("GFXASM_BUILD_DIR") and self.path.resolve() == DEFAULT_MANIFEST.resolve():
            build_dir = Path(os.environ["GFXASM_BUILD_DIR"])
        manifest = Manifest(
            path=self.path.resolve(),
            build_dir=build_dir.resolve(),
            prebuilt=root == packaged_data().resolve(),
            include_dirs=tuple((root / self.string(d, None, "include_dirs")).resolve()
                               for d in self.sequence(data.get("include_dirs", []), None, "include_dirs")),
            cases=(root / self.string(cases, None, "cases")).resolve() if cases is not None else None,
        )
        kernels = data["kernels"] or {}
        self.mapping(kernels, None, "kernels")
        variant_owner: dict[str, str] = {}
        for name, spec in kernels.items():
            kernel = self.kernel(manifest, str(name), spec)
            for variant in kernel.variants:
                if variant in variant_owner:
                    raise self.fail(name, f"variants.{variant}", f"variant name already used by "
                                    f"kernel '{variant_owner[variant]}' (build/<variant>.co must be unique)")
                variant_owner[variant] = name
            manifest.kernels[kernel.name] = kernel
        return manifest

    # generic shape checks

    def mapping(self, value: Any, kernel: str | None, where: str, allowed: set[str] | None = None,
                required: set[str] = frozenset()) -> dict:
        """A mapping with no unknown and no missing fields; `where` is "" at the top level."""
        def path(key: str) -> str:
            return f"{where}.{key}" if where else key
        if not isinstance(value, dict):
            raise self.fail(kernel, where or "(top level)", f"expected a mapping, got {type(value).__name__}")
        unknown = sorted(set(map(str, value)) - allowed) if allowed is not None else []
        if unknown:
            raise self.fail(kernel, path(unknown[0]), f"unknown field; allowed: {', '.join(sorted(allowed))}")
        missing = sorted(required - set(value))
        if missing:
            raise self.fail(kernel, path(missing[0]), "required field is missing")
        return value

    def sequence(self, value: Any, kernel: str | None, where: str) -> list:
        if not isinstance(value, list):
            raise self.fail(kernel, where, f"expected a list, got {type(value).__name__}")
        return value

    def string(self, value: Any, kernel: str | None, where: str, pattern: re.Pattern | None = None) -> str:
        if not isinstance(value, str) or not value:
            raise self.fail(kernel, where, f"expected a non-empty string, got {value!r}")
        if pattern is not None and not pattern.match(value):
            raise self.fail(kernel, where, f"'{value}' is not a valid name")
        return value

    def integer(self, value: Any, kernel: str | None, where: str, low: int, high: int) -> int:
        if type(value) is not int:
            raise self.fail(kernel, where, f"expected an integer, got {value!r}")
        if not low <= value <= high:
            raise self.fail(kernel, where, f"{value} is outside [{low}, {high}]")
        return value

    def choice(self, value: Any, kernel: str | None, where: str, allowed: tuple[str, ...]) -> str:
        if value not in allowed:
            raise self.fail(kernel, where, f"expected one of {', '.join(allowed)}, got {value!r}")
        return value

    def identifier(self, value: Any, kernel: str | None, where: str) -> str:
        name = self.string(value, kernel, where, _IDENTIFIER)
        if keyword.iskeyword(name):
            raise self.fail(kernel, where, f"'{name}' is a Python keyword")
        return name

    # kernels

    def kernel(self, manifest: Manifest, name: str, spec: Any) -> Kernel:
        self.identifier(name, name, "name")
        self.mapping(spec, name, "", _KERNEL_FIELDS, required={"source", "workgroup", "grid", "args"})
        source = manifest.root / self.string(spec["source"], name, "source")
        if not source.is_file():
            raise self.fail(name, "source", f"{source} does not exist")
        kernel = Kernel(
            name=name,
            manifest=manifest,
            source=source.resolve(),
            symbol=self.string(spec.get("symbol", name), name, "symbol", _SYMBOL),
            workgroup=self.workgroup(spec["workgroup"], name),
            lds_bytes=self.integer(spec.get("lds_bytes", 0), name, "lds_bytes", 0, LDS_LIMIT_BYTES),
            grid=self.grid(spec["grid"], name),
            float_denorm_mode_32=self.integer(spec.get("float_denorm_mode_32", 3), name,
                                              "float_denorm_mode_32", 0, 3),
            description=str(spec.get("description", "")),
            schedule=self.choice(spec.get("schedule", "serial"), name, "schedule", SCHEDULES),
        )
        args = self.args(spec["args"], name)
        self.check_names(kernel, args)
        variants = spec.get("variants") or {name: {}}
        for variant_name, variant_spec in self.mapping(variants, name, "variants").items():
            variant = self.variant(kernel, str(variant_name), variant_spec or {}, args)
            kernel.variants[variant.name] = variant
        return kernel

    def workgroup(self, value: Any, kernel: str) -> tuple[int, int, int]:
        dims = [value] if type(value) is int else self.sequence(value, kernel, "workgroup")
        if not 1 <= len(dims) <= 3:
            raise self.fail(kernel, "workgroup", f"expected 1 to 3 dimensions, got {len(dims)}")
        dims = [self.integer(d, kernel, f"workgroup[{i}]", 1, MAX_WORKGROUP_SIZE) for i, d in enumerate(dims)]
        x, y, z = dims + [1] * (3 - len(dims))
        if x * y * z > MAX_WORKGROUP_SIZE:
            raise self.fail(kernel, "workgroup", f"{x}x{y}x{z} = {x * y * z} work-items exceeds "
                            f"{MAX_WORKGROUP_SIZE}")
        return x, y, z

    def grid(self, value: Any, kernel: str) -> tuple[GridExpr, GridExpr, GridExpr]:
        texts = self.sequence(value, kernel, "grid")
        if not 1 <= len(texts) <= 3:
            raise self.fail(kernel, "grid", f"expected 1 to 3 expressions, got {len(texts)}")
        padded = texts + [1] * (3 - len(texts))
        return tuple(self.expression(text, kernel, f"grid[{i}]") for i, text in enumerate(padded))

    def expression(self, text: Any, kernel: str, where: str) -> GridExpr:
        if isinstance(text, bool) or not isinstance(text, (str, int)):
            raise self.fail(kernel, where, f"expected an expression or integer, got {text!r}")
        try:
            return GridExpr(text)
        except GridExprError as exc:
            raise self.fail(kernel, where, str(exc)) from None

    def args(self, value: Any, kernel: str) -> list[dict]:
        """Validated argument specs (types resolved, offsets not yet computed)."""
        specs, seen = [], set()
        for i, spec in enumerate(self.sequence(value, kernel, "args")):
            where = f"args[{i}]"
            self.mapping(spec, kernel, where, _ARG_FIELDS, required={"name", "type"})
            name = self.identifier(spec["name"], kernel, f"{where}.name")
            where = f"args[{i}] ({name})"
            if name in RESERVED_ARG_NAMES:
                raise self.fail(kernel, f"{where}.name", f"'{name}' is reserved "
                                f"({', '.join(sorted(RESERVED_ARG_NAMES))})")
            if name in seen:
                raise self.fail(kernel, f"{where}.name", "duplicate argument name")
            seen.add(name)
            arg_type = self.arg_type(spec["type"], kernel, f"{where}.type")
            specs.append(self.arg_details(spec, kernel, where, name, arg_type))
        return specs

    def arg_type(self, value: Any, kernel: str, where: str) -> ArgType:
        if value not in ARG_TYPES:
            raise self.fail(kernel, where, f"unknown type {value!r}; expected one of {', '.join(ARG_TYPES)}")
        return ARG_TYPES[value]

    def arg_details(self, spec: dict, kernel: str, where: str, name: str, arg_type: ArgType) -> dict:
        direction = spec.get("dir", None if arg_type.is_pointer else "in")
        if direction not in DIRECTIONS:
            raise self.fail(kernel, f"{where}.dir", f"expected one of {', '.join(DIRECTIONS)}, got {direction!r}")
        details = {"name": name, "type": arg_type, "direction": direction}
        if not arg_type.is_pointer:
            if direction != "in":
                raise self.fail(kernel, f"{where}.dir", "a scalar argument can only be 'in'")
            for pointer_only in ("shape", "rank", "contiguous", "numel", "strides"):
                if pointer_only in spec:
                    raise self.fail(kernel, f"{where}.{pointer_only}", "only pointer arguments have it")
            return details
        if "shape" in spec and "rank" in spec:
            raise self.fail(kernel, f"{where}.rank", "give either shape or rank, not both")
        if "shape" in spec:
            shape = tuple(self.dim(d, kernel, f"{where}.shape[{j}]")
                          for j, d in enumerate(self.sequence(spec["shape"], kernel, f"{where}.shape")))
            details.update(shape=shape, rank=len(shape))
        elif "rank" in spec:
            details["rank"] = self.integer(spec["rank"], kernel, f"{where}.rank", 0, 8)
        if "numel" in spec:
            if "shape" in spec:
                raise self.fail(kernel, f"{where}.numel", "a shape already gives the size; numel is for rank-only "
                                "buffers")
            details["numel"] = self.expression(spec["numel"], kernel, f"{where}.numel")
        contiguous = spec.get("contiguous", True)
        if not isinstance(contiguous, bool):
            raise self.fail(kernel, f"{where}.contiguous", f"expected true or false, got {contiguous!r}")
        if "numel" in details and not contiguous:
            raise self.fail(kernel, f"{where}.numel", "numel bounds a contiguous buffer; a strided one's extent "
                            "depends on its strides")
        if "strides" in spec:
            dims = self.sequence(spec["strides"], kernel, f"{where}.strides")
            if details.get("rank") != len(dims):
                raise self.fail(kernel, f"{where}.strides", f"one entry per dim: expected {details.get('rank')} "
                                f"(the rank), got {len(dims)}")
            details["strides"] = tuple(self.dim(d, kernel, f"{where}.strides[{j}]") for j, d in enumerate(dims))
        details["contiguous"] = contiguous
        return details

    def dim(self, value: Any, kernel: str, where: str) -> str | int:
        if type(value) is int:
            return self.integer(value, kernel, where, 0, 2**63 - 1)
        name = self.identifier(value, kernel, where)
        if name in FUNCTIONS:
            raise self.fail(kernel, where, f"'{name}' names a grid function")
        return name

    def check_names(self, kernel: Kernel, args: list[dict]) -> None:
        """Shape names, scalar arguments and grid names must fit together."""
        by_name = {a["name"]: a for a in args}
        shape_names = {d for a in args for d in a.get("shape", ()) if isinstance(d, str)}
        for dim in sorted(shape_names & by_name.keys()):
            if not by_name[dim]["type"].is_integer:
                raise self.fail(kernel.name, "args", f"shape name '{dim}' is also argument '{dim}' of type "
                                f"{by_name[dim]['type'].name}; only an integer scalar can share a shape name")
        known = shape_names | {a["name"] for a in args if a["type"].is_integer}
        expressions = [(f"grid[{i}]", expr) for i, expr in enumerate(kernel.grid)]
        expressions += [(f"args[{i}] ({a['name']}).numel", a["numel"]) for i, a in enumerate(args) if "numel" in a]
        integers = {a["name"] for a in args if a["type"].is_integer}
        for i, a in enumerate(args):
            for j, dim in enumerate(a.get("strides", ())):
                if isinstance(dim, str) and dim not in integers:
                    raise self.fail(kernel.name, f"args[{i}] ({a['name']}).strides[{j}]", f"'{dim}' is not an "
                                    f"integer scalar argument (a stride is given in bytes by one)")
        for where, expr in expressions:
            unknown = sorted(expr.names - known)
            if unknown:
                raise self.fail(kernel.name, where, f"'{expr.text}' uses {', '.join(unknown)}, which is "
                                f"neither an integer scalar argument nor a shape name")

    def variant(self, kernel: Kernel, name: str, spec: Any, args: list[dict]) -> Variant:
        where = f"variants.{name}"
        self.string(name, kernel.name, where, _IDENTIFIER)
        self.mapping(spec, kernel.name, where, _VARIANT_FIELDS)
        defines = {}
        for define, value in self.mapping(spec.get("defines") or {}, kernel.name, f"{where}.defines").items():
            self.identifier(define, kernel.name, f"{where}.defines.{define}")
            if define.startswith(KERNARG_SYMBOL_PREFIX) or define in GENERATED_SYMBOLS:
                raise self.fail(kernel.name, f"{where}.defines.{define}", "the generated code part defines "
                                f"this name (kernarg symbols '{KERNARG_SYMBOL_PREFIX}*' and "
                                f"{', '.join(sorted(GENERATED_SYMBOLS))})")
            defines[define] = self.integer(value, kernel.name, f"{where}.defines.{define}", -2**63, 2**63 - 1)
        types = {a["name"]: a["type"] for a in args}
        for arg_name, type_name in self.mapping(spec.get("types") or {}, kernel.name, f"{where}.types").items():
            if arg_name not in types or not types[arg_name].is_pointer:
                pointers = ", ".join(a["name"] for a in args if a["type"].is_pointer)
                raise self.fail(kernel.name, f"{where}.types.{arg_name}",
                                f"not a pointer argument of this kernel (pointers: {pointers})")
            new_type = self.arg_type(type_name, kernel.name, f"{where}.types.{arg_name}")
            if not new_type.is_pointer:
                raise self.fail(kernel.name, f"{where}.types.{arg_name}", "a pointer stays a pointer")
            types[arg_name] = new_type
        offsets, size = layout(types[a["name"]] for a in args)
        resolved = tuple(Arg(**{**a, "type": types[a["name"]]}, offset=o) for a, o in zip(args, offsets))
        return Variant(name=name, kernel=kernel, defines=defines, args=resolved, kernarg_size=size)
