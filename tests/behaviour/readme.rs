//! The README's quick start must be `examples/quickstart.rs` verbatim, so that what a new user
//! copies is what CI compiles (clippy builds every example) and runs; and every link between the
//! README and the documents in `docs/` must lead somewhere, so that moving or renaming a section
//! fails here instead of leaving a reader at a dead end.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

#[test]
fn readme_quick_start_is_the_quickstart_example() {
    let readme = include_str!("../../README.md");
    let example = include_str!("../../examples/quickstart.rs");
    let block = format!("```rust\n{}\n```", example.trim_end());
    assert!(
        readme.contains(&block),
        "README.md's quick start differs from examples/quickstart.rs: paste the file into the \
         README's ```rust block under \"Quick start\""
    );
}

#[test]
fn readme_names_the_commands_that_ci_runs() {
    let readme = include_str!("../../README.md");
    let ci = include_str!("../../.ci/run");
    for command in [
        "cargo test --workspace --all-features",
        "cargo run --example process_traces",
    ] {
        assert!(readme.contains(command), "README.md lacks `{command}`");
        assert!(ci.contains(command), ".ci/run lacks `{command}`");
    }
}

/// The README and every Markdown document in `docs/`.
fn documents() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut documents = vec![root.join("README.md")];
    let docs = std::fs::read_dir(root.join("docs")).expect("docs/ exists");
    for entry in docs {
        let path = entry.expect("docs/ is readable").path();
        if path.extension().is_some_and(|extension| extension == "md") {
            documents.push(path);
        }
    }
    documents.sort();
    documents
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

/// The targets of the Markdown links `[text](target)` in `text`, outside fenced code blocks.
fn link_targets(text: &str) -> Vec<String> {
    let mut targets = Vec::new();
    let mut in_code = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
            continue;
        }
        if in_code {
            continue;
        }
        let mut rest = line;
        while let Some(start) = rest.find("](") {
            let after = &rest[start + 2..];
            let Some(end) = after.find(')') else { break };
            targets.push(after[..end].to_owned());
            rest = &after[end..];
        }
    }
    targets
}

/// The anchors GitHub gives the headings of `text`: lower case, spaces to `-`, and every
/// character but letters, digits, `-` and `_` dropped.
fn heading_anchors(text: &str) -> BTreeSet<String> {
    let mut in_code = false;
    let mut anchors = BTreeSet::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
        }
        if in_code || !line.starts_with('#') {
            continue;
        }
        let heading = line.trim_start_matches('#').trim();
        let anchor: String = heading
            .to_lowercase()
            .chars()
            .filter_map(|c| match c {
                ' ' => Some('-'),
                c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
                _ => None,
            })
            .collect();
        anchors.insert(anchor);
    }
    anchors
}

#[test]
fn every_link_in_the_readme_and_the_docs_leads_to_a_file_and_heading_that_exist() {
    let mut broken = Vec::new();
    let mut checked = 0;
    for document in documents() {
        for target in link_targets(&read(&document)) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            checked += 1;
            let (file, anchor) = match target.split_once('#') {
                Some((file, anchor)) => (file, Some(anchor)),
                None => (target.as_str(), None),
            };
            let path = if file.is_empty() {
                document.clone()
            } else {
                document
                    .parent()
                    .expect("a document has a directory")
                    .join(file)
            };
            if !path.exists() {
                broken.push(format!("{}: `{target}`: no such file", document.display()));
                continue;
            }
            if let Some(anchor) = anchor {
                if !heading_anchors(&read(&path)).contains(anchor) {
                    broken.push(format!(
                        "{}: `{target}`: {} has no heading with that anchor",
                        document.display(),
                        path.display()
                    ));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
    // The README alone links every document in docs/: fewer means the scanner stopped seeing them.
    assert!(
        checked >= 10,
        "only {checked} links found: is the link scanner still working?"
    );
}

#[test]
fn the_readme_links_every_document_in_docs() {
    let readme = include_str!("../../README.md");
    let linked: BTreeSet<String> = link_targets(readme).into_iter().collect();
    for document in documents()
        .iter()
        .filter(|path| path.parent().unwrap().ends_with("docs"))
    {
        let name = document.file_name().unwrap().to_string_lossy();
        assert!(
            linked.contains(&format!("docs/{name}")),
            "README.md does not link docs/{name}: add it to \"Read more\""
        );
    }
}
