//! The crate map in `src/lib.rs` lists the folders and modules from the bottom up, and says each
//! uses only the ones above it. This reads the sources and holds the crate to that: a module
//! that names (`crate::<module>`, or an item the crate root re-exports from it) a module listed
//! after itself fails here, with the file and the use.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// The modules of the crate map's table, in its order (bottom first).
fn table_order(lib: &str) -> Vec<String> {
    lib.lines()
        .filter_map(|line| line.strip_prefix("//! | `"))
        .filter_map(|row| row.split('`').next())
        .map(str::to_owned)
        .collect()
}

/// The items the crate root re-exports (`pub use module::{A, B};`), by the module they come
/// from: `crate::LockError` is a use of `error`.
fn re_exports(lib: &str) -> HashMap<String, String> {
    let mut items = HashMap::new();
    for line in lib.lines() {
        let Some(path) = line.trim().strip_prefix("pub use ") else {
            continue;
        };
        let path = path.trim_end_matches(';');
        let Some((module, names)) = path.split_once("::") else {
            continue;
        };
        let names = names.trim_start_matches('{').trim_end_matches('}');
        for name in names.split(',') {
            let name = name.trim().rsplit("::").next().unwrap_or_default();
            if !name.is_empty() {
                items.insert(name.to_owned(), module.to_owned());
            }
        }
    }
    items
}

/// Every `.rs` file under `dir`.
fn sources(dir: &Path, found: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("the source folder reads") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            sources(&path, found);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            found.push(path);
        }
    }
}

/// The code of `text` without its comments and its unit tests (a test may reach anywhere).
fn code(text: &str) -> String {
    let text = text
        .find("#[cfg(test)]\nmod tests")
        .map_or(text, |at| &text[..at]);
    text.lines()
        .filter(|line| !line.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The crate modules `code` names: `crate::name`, and each name in `crate::{A, b::C}`.
fn named(code: &str, re_exported: &HashMap<String, String>) -> Vec<String> {
    let mut modules = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find("crate::") {
        rest = &rest[at + "crate::".len()..];
        let names: Vec<&str> = if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            group[..end]
                .split(',')
                .filter_map(|path| path.trim().split("::").next())
                .collect()
        } else {
            rest.split(|c: char| !(c.is_alphanumeric() || c == '_'))
                .next()
                .into_iter()
                .collect()
        };
        for name in names {
            let module = re_exported.get(name).map_or(name, String::as_str);
            modules.push(module.to_owned());
        }
    }
    modules
}

#[test]
fn no_module_uses_one_listed_after_it_in_the_crate_map() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let lib = std::fs::read_to_string(src.join("lib.rs")).expect("lib.rs reads");
    let order = table_order(&lib);
    assert!(
        order.len() >= 10 && order.iter().any(|module| module == "backend"),
        "the crate map's table was found: {order:?}"
    );
    let rank = |module: &str| order.iter().position(|listed| listed == module);
    let re_exported = re_exports(&lib);
    assert_eq!(
        re_exported.get("LockError").map(String::as_str),
        Some("error")
    );

    let mut files = Vec::new();
    sources(&src, &mut files);
    let mut upward = Vec::new();
    for file in &files {
        let relative = file.strip_prefix(&src).expect("under src");
        let top = relative
            .components()
            .next()
            .and_then(|part| part.as_os_str().to_str())
            .map(|part| part.trim_end_matches(".rs").to_owned())
            .unwrap_or_default();
        let Some(own) = rank(&top) else {
            // lib.rs itself, and any file the map does not list (the test below catches those).
            continue;
        };
        let text = std::fs::read_to_string(file).expect("a source file reads");
        for used in named(&code(&text), &re_exported) {
            if rank(&used).is_some_and(|theirs| theirs > own) {
                upward.push(format!("{}: {top} uses {used}", relative.display()));
            }
        }
    }
    upward.sort();
    upward.dedup();
    assert!(
        upward.is_empty(),
        "modules that use one listed after them in the crate map (move the item down, or \
         reorder the table): {upward:#?}"
    );
}

#[test]
fn the_crate_map_lists_every_module() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let lib = std::fs::read_to_string(src.join("lib.rs")).expect("lib.rs reads");
    let order = table_order(&lib);
    let declared: Vec<String> = lib
        .lines()
        .map(str::trim)
        .filter_map(|line| {
            line.strip_prefix("mod ")
                .or_else(|| line.strip_prefix("pub mod "))
        })
        .map(|name| name.trim_end_matches(';').to_owned())
        .collect();
    assert!(!declared.is_empty());
    for module in &declared {
        assert!(
            order.contains(module),
            "`{module}` is declared in lib.rs but not listed in the crate map: {order:?}"
        );
    }
}

#[test]
fn an_upward_use_is_seen() {
    let lib =
        "//! | `support` | x |\n//! | `error` | y |\npub use error::{LockError, LostCause};\n";
    let order = table_order(lib);
    assert_eq!(order, ["support", "error"]);
    let re_exported = re_exports(lib);
    let uses = named(
        "use crate::{LockError, support::retry};\nlet x = crate::error::thing;",
        &re_exported,
    );
    assert_eq!(uses, ["error", "support", "error"]);
    assert_eq!(
        code("use crate::a;\n// crate::b\n#[cfg(test)]\nmod tests { crate::c }"),
        "use crate::a;"
    );
}
