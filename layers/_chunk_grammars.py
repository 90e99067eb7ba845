"""Which tree-sitter grammar reads which file, and what its syntax nodes mean for chunking.

Every grammar ships as a wheel (compiled in, nothing downloaded at run time) and loads lazily; a
grammar that is missing or will not load makes :func:`grammar_for` return ``None``, and the file
is then chunked by the line-aware fallback.

Beyond source code, a few formats are read by their syntax too: Markdown (the block grammar: its
``section`` nodes nest by heading level; inline text is not parsed), JSON, TOML and YAML (a key
with its value is a "definition" named by the key), and GDScript. Each grammar module can add
definition node types and *transparent* containers (the object of a JSON document, a YAML block
mapping) whose children count at the container's own depth, so top-level keys are top-level
boundaries. See :class:`Profile`.
"""

from __future__ import annotations

import importlib
import threading
from dataclasses import dataclass
from typing import Any

__all__ = [
    "BODY_TYPES",
    "DEFINITIONS",
    "FUNCTION_VALUES",
    "GRAMMARS",
    "LEADING",
    "NAME_FIELDS",
    "NAME_LEAVES",
    "WRAPPERS",
    "Profile",
    "grammar_for",
    "profile_for",
]

# file extension -> (grammar module, function returning its language pointer)
GRAMMARS: dict[str, tuple[str, str]] = {
    ".py": ("tree_sitter_python", "language"), ".pyi": ("tree_sitter_python", "language"),
    ".rs": ("tree_sitter_rust", "language"),
    ".js": ("tree_sitter_javascript", "language"), ".jsx": ("tree_sitter_javascript", "language"),
    ".mjs": ("tree_sitter_javascript", "language"), ".cjs": ("tree_sitter_javascript", "language"),
    ".ts": ("tree_sitter_typescript", "language_typescript"),
    ".mts": ("tree_sitter_typescript", "language_typescript"),
    ".cts": ("tree_sitter_typescript", "language_typescript"),
    ".tsx": ("tree_sitter_typescript", "language_tsx"),
    ".go": ("tree_sitter_go", "language"), ".java": ("tree_sitter_java", "language"),
    ".cs": ("tree_sitter_c_sharp", "language"), ".c": ("tree_sitter_c", "language"),
    ".h": ("tree_sitter_c", "language"), ".cc": ("tree_sitter_cpp", "language"),
    ".cpp": ("tree_sitter_cpp", "language"), ".cxx": ("tree_sitter_cpp", "language"),
    ".hpp": ("tree_sitter_cpp", "language"), ".hh": ("tree_sitter_cpp", "language"),
    ".hxx": ("tree_sitter_cpp", "language"),
    ".gd": ("tree_sitter_gdscript", "language"),
    ".md": ("tree_sitter_markdown", "language"), ".markdown": ("tree_sitter_markdown", "language"),
    ".json": ("tree_sitter_json", "language"),
    ".toml": ("tree_sitter_toml", "language"),
    ".yaml": ("tree_sitter_yaml", "language"), ".yml": ("tree_sitter_yaml", "language"),
}  # fmt: skip

# Nodes that define a named thing: their boundaries are the best cuts and they carry symbols.
DEFINITIONS = frozenset({
    # Python (and GDScript, whose grammar uses the same names)
    "function_definition", "class_definition", "decorated_definition",
    # Rust
    "function_item", "function_signature_item", "impl_item", "struct_item", "enum_item", "trait_item",
    "mod_item", "union_item", "macro_definition", "type_item", "const_item", "static_item",
    # JavaScript / TypeScript
    "function_declaration", "generator_function_declaration", "class_declaration",
    "abstract_class_declaration", "method_definition", "interface_declaration",
    "type_alias_declaration", "enum_declaration", "internal_module", "module",
    "function_signature", "abstract_method_signature", "method_signature",
    # Go
    "method_declaration", "type_declaration",
    # Java / C#
    "constructor_declaration", "record_declaration", "struct_declaration", "namespace_declaration",
    "file_scoped_namespace_declaration", "property_declaration", "annotation_type_declaration",
    "delegate_declaration", "destructor_declaration", "operator_declaration", "indexer_declaration",
    # C / C++
    "class_specifier", "struct_specifier", "union_specifier", "enum_specifier", "namespace_definition",
    "template_declaration",
})  # fmt: skip
# Wrappers whose meaning is the definition inside them (``export function f``, ``const f = () =>``).
WRAPPERS = frozenset({"export_statement", "lexical_declaration", "variable_declaration", "declaration"})
FUNCTION_VALUES = frozenset(
    {"arrow_function", "function_expression", "function", "class", "generator_function"}
)
# Siblings that belong to the definition right below them.
LEADING = frozenset({"decorator", "attribute_item", "attribute", "annotation", "marker_annotation"})
NAME_FIELDS = ("name", "declarator", "declaration", "definition", "type", "pattern")
# Node types whose text is a name.
NAME_LEAVES = frozenset({
    "identifier", "type_identifier", "field_identifier", "property_identifier", "qualified_identifier",
    "scoped_identifier", "scoped_type_identifier", "namespace_identifier", "generic_type", "constant",
    "operator_name", "destructor_name", "primitive_type", "name",
})  # fmt: skip
BODY_TYPES = frozenset({
    "block", "statement_block", "class_body", "declaration_list", "field_declaration_list",
    "compound_statement", "interface_body", "enum_body", "constructor_body", "object_type",
    "enum_variant_list", "enum_member_declaration_list", "enumerator_list", "annotation_type_body",
    "record_declaration_body", "body",
})  # fmt: skip


@dataclass(frozen=True, slots=True)
class Profile:
    """What one grammar adds to the shared tables.

    ``definitions``: more node types that are definitions; ``transparent``: containers whose
    children stay at the container's depth; ``key_named``: definitions named by the text of
    their first named child (a JSON/TOML/YAML key, a Markdown heading) rather than by a name
    field; ``sections``: definitions are Markdown sections (scored by heading level, and a cut
    before one needs no overlap).
    """

    definitions: frozenset[str] = frozenset()
    transparent: frozenset[str] = frozenset()
    key_named: bool = False
    sections: bool = False


_CODE = Profile()
_PROFILES: dict[str, Profile] = {
    "tree_sitter_gdscript": Profile(
        definitions=frozenset({"constructor_definition", "enum_definition", "signal_statement"})
    ),
    "tree_sitter_markdown": Profile(definitions=frozenset({"section"}), key_named=True, sections=True),
    "tree_sitter_json": Profile(
        definitions=frozenset({"pair"}), transparent=frozenset({"object"}), key_named=True
    ),
    "tree_sitter_toml": Profile(
        definitions=frozenset({"pair", "table", "table_array_element"}), key_named=True
    ),
    "tree_sitter_yaml": Profile(
        definitions=frozenset({"block_mapping_pair"}),
        transparent=frozenset({"block_mapping", "block_node", "document"}),
        key_named=True,
    ),
}

_lock = threading.Lock()
_languages: dict[str, Any] = {}
_missing: set[str] = set()


def profile_for(path_suffix: str) -> Profile:
    """The chunking profile of a file extension (the plain code profile when it has none)."""
    spec = GRAMMARS.get(path_suffix.lower())
    return _PROFILES.get(spec[0], _CODE) if spec is not None else _CODE


def grammar_for(path_suffix: str) -> Any | None:
    """The tree-sitter ``Language`` for a file extension (``.rs``), or ``None`` without a grammar."""
    spec = GRAMMARS.get(path_suffix.lower())
    if spec is None:
        return None
    key = f"{spec[0]}.{spec[1]}"
    with _lock:
        if key in _languages:
            return _languages[key]
        if key in _missing:
            return None
        try:
            from tree_sitter import Language

            module = importlib.import_module(spec[0])
            language = Language(getattr(module, spec[1])())
        except (ImportError, AttributeError, ValueError, TypeError, OSError):
            _missing.add(key)  # a grammar that cannot load: the line-aware chunker takes over
            return None
        _languages[key] = language
        return language
