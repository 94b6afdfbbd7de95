//! The workspace keeps the shape STYLE.md asks for: no import circle
//! between the files of any crate, and no source file above 700 lines
//! (every `.rs` below `crates/*/src`, tests inside them and this kit
//! included). `python3 ../shared/tools/modgraph.py crates` applies the same
//! rules and lists the largest files as well.
//!
//! - `lex`: Rust source as tokens, comments and literals out of the way;
//! - `graph`: each crate's files, what each imports, and the circles.

mod graph;
mod lex;

use std::path::{Path, PathBuf};

/// The most lines a source file may have.
const MAX_LINES: usize = 700;

/// `crates/`, the folder of every crate.
fn crates() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the test kit lives in crates/")
        .to_owned()
}

/// Every crate with a `src/`, by folder name, and its graph.
fn graphs() -> Vec<(String, graph::Graph)> {
    let mut crates: Vec<PathBuf> = std::fs::read_dir(crates())
        .expect("read crates/")
        .map(|entry| entry.expect("a crate folder").path())
        .filter(|path| path.join("src").is_dir())
        .collect();
    crates.sort();
    crates
        .iter()
        .map(|folder| {
            let src = folder.join("src");
            let mut files = Vec::new();
            sources(&src, &src, &mut files);
            files.sort();
            let name = folder.file_name().expect("a folder name");
            (name.to_string_lossy().into_owned(), graph::graph(&files))
        })
        .collect()
}

/// The `.rs` files below `folder`, as (path below `src`, text).
fn sources(src: &Path, folder: &Path, out: &mut Vec<(String, String)>) {
    for entry in std::fs::read_dir(folder).expect("read a source folder") {
        let path = entry.expect("a source entry").path();
        if path.is_dir() {
            sources(src, &path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let below = path.strip_prefix(src).expect("below src/");
            let below = below.to_string_lossy().replace('\\', "/");
            let text = std::fs::read_to_string(&path).expect("read a source file");
            out.push((below, text));
        }
    }
}

#[test]
fn no_import_circle_inside_any_crate() {
    let mut found = Vec::new();
    for (name, graph) in graphs() {
        let shown = |at: usize| format!("crates/{name}/src/{}", graph.files[at].path);
        for circle in graph::circles(&graph) {
            let files: Vec<String> = circle.iter().map(|&at| shown(at)).collect();
            let mut text = format!("circle: {}", files.join(" "));
            for &from in &circle {
                for to in graph.imports[from].iter().filter(|to| circle.contains(to)) {
                    text += &format!("\n    {} imports {}", shown(from), shown(*to));
                }
            }
            found.push(text);
        }
    }
    assert!(
        found.is_empty(),
        "{} import circle(s); break each by moving what both sides use below them:\n{}",
        found.len(),
        found.join("\n")
    );
}

#[test]
fn no_source_file_above_700_lines() {
    let mut found: Vec<(usize, String)> = graphs()
        .into_iter()
        .flat_map(|(name, graph)| {
            graph
                .files
                .into_iter()
                .filter(|file| file.lines > MAX_LINES)
                .map(move |file| (file.lines, format!("crates/{name}/src/{}", file.path)))
        })
        .collect();
    found.sort_by(|a, b| b.cmp(a));
    let listed: Vec<String> = found
        .iter()
        .map(|(lines, path)| format!("{path} {lines}"))
        .collect();
    assert!(
        found.is_empty(),
        "{} file(s) above {MAX_LINES} lines; split each by concept:\n{}",
        found.len(),
        listed.join("\n")
    );
}
