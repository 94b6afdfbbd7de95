//! A crate's files as a graph: a file imports another when it names a path
//! into the module that file defines (`use crate::a::b`, `super::x::f()`,
//! `child::T` for a `mod child;` it declares), resolved to the longest
//! module prefix that is a file. Inline test modules (`#[cfg(test)] mod x {
//! … }`) are left out: tests may reach anywhere. A file using its ancestors
//! (`super::T`, `crate::T` from lib.rs) is part of them, not an import, so a
//! parent and its child never make a circle.

use std::collections::{BTreeMap, BTreeSet};

use crate::lex::{Token, tokens};

/// A source file of a crate.
pub struct File {
    /// Its path below `src/`, with `/` between folders.
    pub path: String,
    /// Its module path: `["admin", "http"]`, empty for the crate roots.
    pub module: Vec<String>,
    /// Its lines.
    pub lines: usize,
}

/// The files of one crate and what each imports.
pub struct Graph {
    /// Every file, in the order given.
    pub files: Vec<File>,
    /// For each file, the files it imports (indices into `files`).
    pub imports: Vec<BTreeSet<usize>>,
}

/// What one file says about modules.
#[derive(Default)]
struct Reading {
    /// Each path it names with at least two segments, with the inline
    /// modules around it.
    paths: Vec<(Vec<String>, Vec<String>)>,
    /// The file modules it declares at its top level, with their `#[path]`.
    children: Vec<(String, Option<String>)>,
}

/// The graph of one crate from its `(path below src/, text)` pairs.
pub fn graph(sources: &[(String, String)]) -> Graph {
    let readings: Vec<Reading> = sources.iter().map(|(_, text)| read(text)).collect();
    let mut files: Vec<File> = sources
        .iter()
        .map(|(path, text)| File {
            path: path.clone(),
            module: module_of(path),
            lines: text.lines().count(),
        })
        .collect();
    // `#[path = "…"] mod name;` puts a file where its declaring file says.
    for (at, reading) in readings.iter().enumerate() {
        for (name, path) in &reading.children {
            let Some(path) = path else { continue };
            let folder = files[at].path.rsplit_once('/').map_or("", |(f, _)| f);
            let target = normalize(&format!("{folder}/{path}"));
            let mut module = files[at].module.clone();
            module.push(name.clone());
            if let Some(file) = files.iter_mut().find(|f| f.path == target) {
                file.module = module;
            }
        }
    }
    let modules: BTreeMap<&[String], usize> = files
        .iter()
        .enumerate()
        .map(|(at, f)| (f.module.as_slice(), at))
        .collect();
    let imports = readings
        .iter()
        .zip(&files)
        .map(|(reading, file)| {
            let children: BTreeSet<&str> =
                reading.children.iter().map(|(n, _)| n.as_str()).collect();
            reading
                .paths
                .iter()
                .filter_map(|(inline, segments)| {
                    let target = resolve(&file.module, inline, &children, segments)?;
                    (0..=target.len())
                        .rev()
                        .find_map(|k| modules.get(&target[..k]).copied())
                })
                .filter(|&to| {
                    let to = &files[to].module;
                    !to.is_empty() && !file.module.starts_with(to)
                })
                .collect()
        })
        .collect();
    Graph { files, imports }
}

/// The circles of `graph`: its strongly connected components of more than
/// one file (Tarjan), each as file indices in path order, in path order.
pub fn circles(graph: &Graph) -> Vec<Vec<usize>> {
    struct Walk<'g> {
        imports: &'g [BTreeSet<usize>],
        index: Vec<Option<usize>>,
        low: Vec<usize>,
        stack: Vec<usize>,
        on_stack: Vec<bool>,
        next: usize,
        found: Vec<Vec<usize>>,
    }
    impl Walk<'_> {
        fn visit(&mut self, v: usize) {
            self.index[v] = Some(self.next);
            self.low[v] = self.next;
            self.next += 1;
            self.stack.push(v);
            self.on_stack[v] = true;
            for &w in self.imports[v].iter() {
                match self.index[w] {
                    None => {
                        self.visit(w);
                        self.low[v] = self.low[v].min(self.low[w]);
                    }
                    Some(seen) if self.on_stack[w] => self.low[v] = self.low[v].min(seen),
                    Some(_) => {}
                }
            }
            if Some(self.low[v]) == self.index[v] {
                let mut component = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack[w] = false;
                    component.push(w);
                    if w == v {
                        break;
                    }
                }
                if component.len() > 1 {
                    self.found.push(component);
                }
            }
        }
    }
    let n = graph.files.len();
    let mut walk = Walk {
        imports: &graph.imports,
        index: vec![None; n],
        low: vec![0; n],
        stack: Vec::new(),
        on_stack: vec![false; n],
        next: 0,
        found: Vec::new(),
    };
    for v in 0..n {
        if walk.index[v].is_none() {
            walk.visit(v);
        }
    }
    let path = |at: &usize| graph.files[*at].path.clone();
    for circle in &mut walk.found {
        circle.sort_by_key(path);
    }
    walk.found.sort_by_key(|circle| path(&circle[0]));
    walk.found
}

/// The module a file below `src/` defines by its place (`a/mod.rs` and
/// `a.rs` define `a`; `lib.rs` and `main.rs` the crate root).
fn module_of(path: &str) -> Vec<String> {
    let mut module: Vec<String> = path
        .trim_end_matches(".rs")
        .split('/')
        .map(str::to_owned)
        .collect();
    let root = module.len() == 1 && matches!(module[0].as_str(), "lib" | "main");
    if root || module.last().is_some_and(|m| m == "mod") {
        module.pop();
    }
    module
}

/// `a/./b/../c.rs` as `a/c.rs`.
fn normalize(path: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            part => parts.push(part),
        }
    }
    parts.join("/")
}

/// The module path `segments` names, seen from inline modules `inline` of
/// the file module `module` that declares `children`; None when it does
/// not start in the crate (`std::…`, `Self::…`, a dependency).
fn resolve(
    module: &[String],
    inline: &[String],
    children: &BTreeSet<&str>,
    segments: &[String],
) -> Option<Vec<String>> {
    let scope: Vec<String> = module.iter().chain(inline).cloned().collect();
    let (mut base, mut rest) = match segments.first()?.as_str() {
        "crate" => (Vec::new(), &segments[1..]),
        "self" => (scope, &segments[1..]),
        "super" => (scope, segments),
        child if inline.is_empty() && children.contains(child) => (scope, segments),
        _ => return None,
    };
    while rest.first().is_some_and(|s| s == "super") {
        base.pop()?;
        rest = &rest[1..];
    }
    base.extend(rest.iter().cloned());
    Some(base)
}

/// The paths a file names and the modules it declares.
fn read(text: &str) -> Reading {
    let tokens = tokens(text);
    let ident = |at: usize| match tokens.get(at) {
        Some(Token::Ident(word)) => Some(word.as_str()),
        _ => None,
    };
    let punct = |at: usize, c: char| tokens.get(at) == Some(&Token::Punct(c));
    let mut reading = Reading::default();
    // One entry per open brace: the inline module it opens, if any.
    let mut braces: Vec<Option<String>> = Vec::new();
    let mut path_attribute: Option<String> = None;
    let inline = |braces: &[Option<String>]| braces.iter().flatten().cloned().collect::<Vec<_>>();
    let mut i = 0;
    while i < tokens.len() {
        if punct(i, '#') {
            let end = attribute_end(&tokens, i);
            let attribute = &tokens[i..end];
            if attribute.get(2) == Some(&Token::Ident("path".into())) {
                path_attribute = attribute.iter().find_map(|t| match t {
                    Token::Str(path) => Some(path.clone()),
                    _ => None,
                });
            }
            let test_only = attribute[1..]
                == [
                    Token::Punct('['),
                    Token::Ident("cfg".into()),
                    Token::Punct('('),
                    Token::Ident("test".into()),
                    Token::Punct(')'),
                    Token::Punct(']'),
                ];
            let item = item_start(&tokens, end);
            if test_only && ident(item) == Some("mod") && punct(item + 2, '{') {
                i = matching_brace(&tokens, item + 2) + 1;
                path_attribute = None;
            } else {
                i = end;
            }
            continue;
        }
        match &tokens[i] {
            Token::Ident(word) if word == "mod" && ident(i + 1).is_some() => {
                let name = ident(i + 1).unwrap_or_default().to_owned();
                if punct(i + 2, '{') {
                    braces.push(Some(name));
                    i += 3;
                    path_attribute = None;
                    continue;
                }
                if punct(i + 2, ';') && braces.iter().all(Option::is_none) {
                    reading.children.push((name, path_attribute.take()));
                }
                i += 2;
            }
            Token::Ident(word) if word == "use" => {
                let mut paths = Vec::new();
                i = use_tree(&tokens, i + 1, Vec::new(), &mut paths);
                let around = inline(&braces);
                reading
                    .paths
                    .extend(paths.into_iter().map(|p| (around.clone(), p)));
            }
            Token::Ident(first) if i == 0 || tokens[i - 1] != Token::PathSep => {
                let mut segments = vec![first.clone()];
                while tokens.get(i + 1) == Some(&Token::PathSep) {
                    let Some(next) = ident(i + 2) else { break };
                    segments.push(next.to_owned());
                    i += 2;
                }
                if segments.len() > 1 {
                    reading.paths.push((inline(&braces), segments));
                }
                i += 1;
            }
            Token::Punct('{') => {
                braces.push(None);
                path_attribute = None;
                i += 1;
            }
            Token::Punct('}') => {
                braces.pop();
                i += 1;
            }
            Token::Punct(';') => {
                path_attribute = None;
                i += 1;
            }
            _ => i += 1,
        }
    }
    reading
}

/// Past the `]` of the attribute (`#[…]` or `#![…]`) that starts at `at`.
fn attribute_end(tokens: &[Token], at: usize) -> usize {
    let open = if tokens.get(at + 1) == Some(&Token::Punct('!')) {
        at + 2
    } else {
        at + 1
    };
    let mut depth = 0;
    for (i, token) in tokens.iter().enumerate().skip(open) {
        match token {
            Token::Punct('[') => depth += 1,
            Token::Punct(']') => {
                depth -= 1;
                if depth == 0 {
                    return i + 1;
                }
            }
            _ => {}
        }
    }
    tokens.len()
}

/// Where the item after `at` starts, past its other attributes and its
/// visibility (`pub`, `pub(crate)`).
fn item_start(tokens: &[Token], mut at: usize) -> usize {
    loop {
        match tokens.get(at) {
            Some(Token::Punct('#')) => at = attribute_end(tokens, at),
            Some(Token::Ident(word)) if word == "pub" => {
                at += 1;
                if tokens.get(at) == Some(&Token::Punct('(')) {
                    while tokens.get(at).is_some_and(|t| *t != Token::Punct(')')) {
                        at += 1;
                    }
                    at += 1;
                }
            }
            _ => return at,
        }
    }
}

/// The `}` that closes the `{` at `open`.
fn matching_brace(tokens: &[Token], open: usize) -> usize {
    let mut depth = 0;
    for (i, token) in tokens.iter().enumerate().skip(open) {
        match token {
            Token::Punct('{') => depth += 1,
            Token::Punct('}') => {
                depth -= 1;
                if depth == 0 {
                    return i;
                }
            }
            _ => {}
        }
    }
    tokens.len()
}

/// Reads the use tree at `at` below `prefix` into `out`, one path per leaf
/// (`a::{b, c::d}` gives `a::b` and `a::c::d`; `a::{self}` gives `a`).
/// Returns where it ends.
fn use_tree(
    tokens: &[Token],
    mut at: usize,
    prefix: Vec<String>,
    out: &mut Vec<Vec<String>>,
) -> usize {
    let mut path = prefix;
    loop {
        match tokens.get(at) {
            Some(Token::PathSep) | Some(Token::Punct('*')) => at += 1,
            Some(Token::Ident(word)) if word == "as" => at += 2,
            Some(Token::Ident(word)) if word == "self" && !path.is_empty() => at += 1,
            Some(Token::Ident(word)) => {
                path.push(word.clone());
                at += 1;
            }
            Some(Token::Punct('{')) => {
                at += 1;
                while at < tokens.len() && tokens[at] != Token::Punct('}') {
                    at = use_tree(tokens, at, path.clone(), out);
                    if tokens.get(at) == Some(&Token::Punct(',')) {
                        at += 1;
                    }
                }
                return at + 1;
            }
            _ => break,
        }
    }
    out.push(path);
    at
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The graph of a crate made of `(path, text)` files.
    fn crate_of(files: &[(&str, &str)]) -> Graph {
        let files: Vec<(String, String)> = files
            .iter()
            .map(|(path, text)| ((*path).to_owned(), (*text).to_owned()))
            .collect();
        graph(&files)
    }

    /// Each file's imports, as paths.
    fn imports(graph: &Graph) -> Vec<(&str, Vec<&str>)> {
        graph
            .files
            .iter()
            .zip(&graph.imports)
            .map(|(file, to)| {
                let to = to.iter().map(|&t| graph.files[t].path.as_str()).collect();
                (file.path.as_str(), to)
            })
            .collect()
    }

    fn circle_paths(graph: &Graph) -> Vec<Vec<&str>> {
        circles(graph)
            .into_iter()
            .map(|c| {
                c.into_iter()
                    .map(|f| graph.files[f].path.as_str())
                    .collect()
            })
            .collect()
    }

    #[test]
    fn two_modules_importing_each_other_are_a_circle() {
        let graph = crate_of(&[
            ("lib.rs", "mod a;\nmod b;\n"),
            ("a.rs", "use crate::b::B;\npub struct A;\n"),
            (
                "b.rs",
                "pub struct B;\nfn f() -> crate::a::A { crate::a::A }\n",
            ),
        ]);
        assert_eq!(circle_paths(&graph), [["a.rs", "b.rs"]]);
    }

    #[test]
    fn a_circle_through_three_files_over_super_and_use_groups() {
        let graph = crate_of(&[
            ("lib.rs", "mod a;\nmod b;\n"),
            ("a/mod.rs", "mod c;\n"),
            ("a/c.rs", "use super::super::{b::{self}, x};\n"),
            ("b/mod.rs", "mod d;\npub use d::D;\n"),
            ("b/d.rs", "pub use crate::{a::c::C as Renamed};\n"),
        ]);
        assert_eq!(imports(&graph)[2], ("a/c.rs", vec!["b/mod.rs"]));
        assert_eq!(circle_paths(&graph), [["a/c.rs", "b/d.rs", "b/mod.rs"]]);
    }

    #[test]
    fn a_parent_and_its_child_importing_each_other_are_no_circle() {
        let graph = crate_of(&[
            ("lib.rs", "mod a;\npub use a::P;\n"),
            (
                "a/mod.rs",
                "mod child;\npub use child::{C};\npub struct P;\n",
            ),
            (
                "a/child.rs",
                "use super::P;\nuse crate::a::P as Q;\npub struct C;\n",
            ),
        ]);
        assert_eq!(
            imports(&graph),
            [
                ("lib.rs", vec!["a/mod.rs"]),
                ("a/mod.rs", vec!["a/child.rs"]),
                ("a/child.rs", vec![])
            ]
        );
        assert!(circles(&graph).is_empty());
    }

    #[test]
    fn a_path_goes_to_the_file_of_its_longest_module_prefix() {
        let graph = crate_of(&[
            ("lib.rs", "mod a;\nmod b;\nmod c;\n"),
            ("a.rs", "mod deep;\n"),
            ("a/deep.rs", ""),
            ("b.rs", "mod inner { pub struct T; }\n"),
            (
                "c.rs",
                "fn f() { crate::a::deep::T::new(); let _ = crate::b::inner::T; }\n",
            ),
        ]);
        assert_eq!(imports(&graph)[4], ("c.rs", vec!["a/deep.rs", "b.rs"]));
    }

    #[test]
    fn comments_strings_tests_and_other_crates_import_nothing() {
        let graph = crate_of(&[
            ("lib.rs", "mod a;\nmod b;\n"),
            (
                "a.rs",
                "// crate::b::x\nconst URL: &str = \"crate::b::x\";\nuse std::b::x;\nuse b::x;\n\
                 #[cfg(test)]\nmod tests {\n    use crate::b::x;\n}\nfn f() { Self::b::x(); }\n",
            ),
            ("b.rs", "use crate::a;\n"),
        ]);
        assert_eq!(imports(&graph)[1], ("a.rs", vec![]));
        assert!(circles(&graph).is_empty());
    }

    #[test]
    fn super_in_an_inline_module_is_its_file() {
        let graph = crate_of(&[
            ("lib.rs", "mod a;\nmod b;\n"),
            ("a.rs", "mod inner {\n    use super::super::b::B;\n}\n"),
            ("b.rs", "pub struct B;\n"),
        ]);
        assert_eq!(imports(&graph)[1], ("a.rs", vec!["b.rs"]));
    }

    #[test]
    fn a_path_attribute_places_its_file() {
        let graph = crate_of(&[
            (
                "lib.rs",
                "mod a;\n#[path = \"elsewhere/b_impl.rs\"]\nmod b;\n",
            ),
            ("a.rs", "use crate::b::B;\n"),
            ("elsewhere/b_impl.rs", "use crate::a::A;\n"),
        ]);
        assert_eq!(graph.files[2].module, ["b"]);
        assert_eq!(circle_paths(&graph), [["a.rs", "elsewhere/b_impl.rs"]]);
    }

    #[test]
    fn files_define_modules_by_their_place() {
        assert_eq!(module_of("lib.rs"), Vec::<String>::new());
        assert_eq!(module_of("main.rs"), Vec::<String>::new());
        assert_eq!(module_of("a/mod.rs"), ["a"]);
        assert_eq!(module_of("a/b.rs"), ["a", "b"]);
        assert_eq!(module_of("a/lib.rs"), ["a", "lib"]);
    }

    #[test]
    fn lines_count_every_line() {
        let graph = crate_of(&[("lib.rs", "a\n\nb\n"), ("x.rs", "a\nb")]);
        assert_eq!(graph.files[0].lines, 3);
        assert_eq!(graph.files[1].lines, 2);
    }
}
