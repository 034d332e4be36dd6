#!/usr/bin/env python3
"""Fails when two source files of one unity program declare the same namespace-scope name.

The presets build each of weft's programs as one translation unit (CMAKE_UNITY_BUILD, and
weft_nvcc_unity_source for the nvcc programs). There, two files' helpers of one name in the same
namespace either fail to compile or, worse, overload each other: a call in one file may then pick
the other file's function in silence. This check reads the unity sources of a build tree (CMake's
Unity/unity_*.cxx and weft_generated/unity/*.cu), lists the names each included file declares at
namespace scope (anonymous namespaces of one TU are one namespace; every branch of #if counts), and
reports each name declared by more than one file. Identical aliases (`using T = X;`, `namespace n =
x;`), using-declarations and template specializations are allowed.

usage: check_unity_names.py <build dir>   (exit 0: no shared name; 1: shared names, listed)
"""
import collections
import itertools
import os
import re
import sys

TOKEN = re.compile(r'"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'|[A-Za-z_]\w*|::|\S')
IDENT = re.compile(r"[A-Za-z_]\w*")
MACRO = re.compile(r"[A-Z_][A-Z0-9_]*")
KEYWORDS = {"operator", "return", "if", "for", "while", "switch", "sizeof", "decltype",
            "noexcept", "alignas", "static_assert", "requires", "template", "typename"}
_suite_ids = itertools.count()


def code_of(text):
    """The text without comments, raw strings and preprocessor lines (with continuations)."""
    text = re.sub(r'R"([^(\s]*)\((.*?)\)\1"', '""', text, flags=re.S)
    text = re.sub(r"//[^\n]*|/\*.*?\*/", " ", text, flags=re.S)
    lines, continued = [], False
    for line in text.split("\n"):
        directive = continued or line.lstrip().startswith("#")
        continued = directive and line.rstrip().endswith("\\")
        lines.append("" if directive else line)
    return "\n".join(lines)


def strip_template_head(head):
    """head without a leading `template <...>`; None for an explicit specialization."""
    while head and head[0] == "template":
        if len(head) > 2 and head[1] == "<" and head[2] == ">":
            return None
        depth, i = 0, 1
        while i < len(head):
            depth += {"<": 1, ">": -1}.get(head[i], 0)
            if depth == 0:
                break
            i += 1
        head = head[i + 1:]
    return head


def declared_name(head):
    """(kind, name, value) for the declaration whose tokens are `head`, or None."""
    head = strip_template_head(head)
    if not head or MACRO.fullmatch(head[0]):  # TEST_CASE(...), CHECK(...) and other macros
        return None
    if head[0] in ("using", "namespace"):
        if len(head) > 2 and head[2] == "=":
            return ("alias", head[1], " ".join(head[3:]))
        return None  # using-declarations and using-directives
    if head[0] in ("extern", "static_assert", "friend"):
        return None
    for i, tok in enumerate(head[:4]):
        if tok in ("struct", "class", "union", "enum", "concept"):
            j = i + 1
            while j < len(head) and head[j] in ("class", "struct"):
                j += 1
            if j < len(head) and IDENT.fullmatch(head[j]):
                if j + 1 < len(head) and head[j + 1] == "<":
                    return None  # a partial or explicit specialization
                return ("type", head[j], "")
            return None
    for i, tok in enumerate(head):
        if tok in ("(", "=", "[", "{"):
            name = head[i - 1] if i > 0 else ""
            if IDENT.fullmatch(name) and name not in KEYWORDS and (i < 2 or head[i - 2] != "operator"):
                return ("function" if tok == "(" else "variable", name, "")
            return None
        if tok == "<" and i > 0 and IDENT.fullmatch(head[i - 1]) and "(" not in head[:i]:
            # name<...>(...) of a specialization, or a templated type in a declaration: go on
            continue
    if len(head) > 1 and IDENT.fullmatch(head[-1]) and head[-1] not in KEYWORDS:
        return ("variable", head[-1], "")
    return None


def namespace_scope_names(path):
    """[(namespace, kind, name, value)] of the declarations at namespace scope in path."""
    with open(path, errors="replace") as f:
        tokens = TOKEN.findall(code_of(f.read()))
    scopes, head, found = [], [], []

    def at_namespace_scope():
        return all(kind == "ns" for kind, _ in scopes)

    def record():
        decl = declared_name(head)
        if decl:
            found.append(("::".join(name for _, name in scopes),) + decl)

    for tok in tokens:
        if tok == "{":
            if at_namespace_scope() and head[:1] == ["namespace"]:
                name = "".join(t for t in head[1:] if t != "inline") or "(anonymous)"
                scopes.append(("ns", name))
            elif at_namespace_scope() and head and MACRO.fullmatch(head[0]) and "SUITE" in head[0]:
                scopes.append(("ns", "(suite %d)" % next(_suite_ids)))  # doctest's own namespace
            elif at_namespace_scope() and head[:2] == ["extern", '"C"']:
                scopes.append(("ns", 'extern "C"'))
            else:
                if at_namespace_scope() and head:
                    record()
                scopes.append(("block", ""))
            head = []
        elif tok == "}":
            if scopes:
                scopes.pop()
            head = []
        elif tok == ";":
            if at_namespace_scope() and head:
                record()
            head = []
        elif at_namespace_scope():
            head.append(tok)
    return found


def unity_sources(build_dir):
    for root, _, files in os.walk(build_dir):
        for name in sorted(files):
            cmake_unity = os.path.basename(root) == "Unity" and re.fullmatch(r"unity_\d+_cxx\.cxx", name)
            nvcc_unity = root.endswith(os.path.join("weft_generated", "unity")) and name.endswith(".cu")
            if cmake_unity or nvcc_unity:
                yield os.path.join(root, name)


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    build_dir = sys.argv[1]
    programs = shared = missing = 0
    for unity in unity_sources(build_dir):
        with open(unity) as f:
            files = re.findall(r'^#include "([^"]+)"', f.read(), flags=re.M)
        if len(files) < 2:
            continue
        programs += 1
        seen = collections.defaultdict(lambda: collections.defaultdict(set))
        for path in files:
            if not os.path.exists(path):  # a generated source of a target not built here
                missing += 1
                continue
            for namespace, kind, name, value in namespace_scope_names(path):
                seen[(namespace, name)][path].add((kind, value))
        for (namespace, name), where in sorted(seen.items()):
            if len(where) < 2:
                continue
            decls = set().union(*where.values())
            if len(decls) == 1 and next(iter(decls))[0] == "alias":
                continue  # the same alias, repeated
            shared += 1
            print("%s: %s::%s is declared in %d files:" % (os.path.relpath(unity, build_dir),
                                                           namespace, name, len(where)))
            for path, kinds in sorted(where.items()):
                print("    %s (%s)" % (path, ", ".join(sorted(k for k, _ in kinds))))
    if missing:
        print("check_unity_names: %d generated sources not built yet were skipped" % missing)
    if programs == 0:
        print("check_unity_names: no unity program of two or more files under %s" % build_dir)
    elif shared:
        print("check_unity_names: %d shared namespace-scope names in %d unity programs: give file-"
              "specific helpers file-specific names, shared ones a home in tests/support" %
              (shared, programs))
        return 1
    else:
        print("check_unity_names: %d unity programs, no namespace-scope name declared by two files"
              % programs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
