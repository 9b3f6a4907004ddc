//! The scanner, the graph, its cycles and the layer table, on small
//! fixture trees.

use std::{collections::BTreeSet, fs, path::Path};

use super::{
    Graph, Source, build,
    cycles::{cycle_lines, cycles},
    is_test_file,
    layers::{Layers, violations},
    load, module_path,
    scan::{expand_use, scan},
    tokens::tokenize,
};

fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| x.to_string()).collect()
}

fn uses(code: &str) -> Vec<Vec<String>> {
    expand_use(&tokenize(code))
        .into_iter()
        .map(|(p, _)| p)
        .collect()
}

#[test]
fn module_paths_follow_the_file_layout() {
    let m = |p: &str| module_path(Path::new(p));
    assert_eq!(m("lib.rs").as_deref(), Some(""));
    assert_eq!(m("main.rs").as_deref(), Some(""));
    assert_eq!(m("app/mod.rs").as_deref(), Some("app"));
    assert_eq!(m("probe/remote.rs").as_deref(), Some("probe::remote"));
    assert_eq!(m("export/plot/mod.rs").as_deref(), Some("export::plot"));
    assert_eq!(m("export/lib.rs").as_deref(), Some("export::lib"));
    assert_eq!(m("bin/tool.rs"), None);
    assert_eq!(m("README.md"), None);
}

#[test]
fn use_groups_expand_and_renames_drop() {
    assert_eq!(
        uses("crate::{a, b::{c, d as e}, f::self, g::*}"),
        vec![
            s(&["crate", "a"]),
            s(&["crate", "b", "c"]),
            s(&["crate", "b", "d"]),
            s(&["crate", "f"]),
            s(&["crate", "g"]),
        ]
    );
    assert_eq!(
        uses("super::{self, x::Y as Z}"),
        vec![s(&["super"]), s(&["super", "x", "Y"])]
    );
    assert_eq!(uses("::std::io"), vec![s(&["::", "std", "io"])]);
    let lines: Vec<usize> = expand_use(&tokenize("crate::{\n a,\n b::c,\n}"))
        .into_iter()
        .map(|(_, l)| l)
        .collect();
    assert_eq!(lines, [2, 3]);
}

#[test]
fn scan_finds_uses_and_inline_paths_but_not_comments_strings_or_tests() {
    let code = r##"
        //! See [`crate::nope::a`].
        use crate::{runner::RunOutcome, export::{csv, live as l}};
        use super::sibling::Thing;
        /* crate::nope::b */
        fn f<'a>(x: &'a str) -> char {
            let _ = "crate::nope::c";
            let _ = r#"crate::nope::d"#;
            crate::app::with_signals(true, |_| Ok(()));
            let c = '"'; let _ = crate::model::units::parse(c);
            child::go();
            '{'
        }
        #[cfg(test)]
        mod tests { use crate::nope::e; fn g() { crate::nope::f(); } }
        #[cfg(test)]
        mod helpers;
        #[cfg(test)]
        pub mod fake;
        #[cfg(test)]
        pub(crate) mod more_tests { use crate::nope::g; }
        mod inner { use super::super::up::X; }
    "##;
    let sc = scan(code);
    let mut got: Vec<(Vec<String>, usize, bool)> = sc
        .paths("a::b")
        .into_iter()
        .map(|t| (t.path, t.line, t.under.is_some()))
        .collect();
    got.sort();
    let mut want = vec![
        (s(&["runner", "RunOutcome"]), 3, false),
        (s(&["export", "csv"]), 3, false),
        (s(&["export", "live"]), 3, false),
        (s(&["a", "sibling", "Thing"]), 4, false),
        (s(&["app", "with_signals"]), 9, false),
        (s(&["model", "units", "parse"]), 10, false),
        (s(&["a", "b", "child", "go"]), 11, true),
        (s(&["a", "up", "X"]), 22, false),
    ];
    want.sort();
    assert_eq!(got, want);
    assert_eq!(sc.test_mods, s(&["helpers", "fake"]));
    assert_eq!(sc.uses_clap, None);
    assert_eq!(
        scan("fn f() {}\n#[derive(clap::Args)] struct A;").uses_clap,
        Some(2)
    );
}

fn graph(files: &[(&str, &str)]) -> Graph {
    let files: Vec<Source> = files
        .iter()
        .map(|(m, c)| Source {
            module: m.to_string(),
            file: format!("{}.rs", m.replace("::", "/")),
            code: c.to_string(),
        })
        .collect();
    build(&files)
}

fn set(v: &[&str]) -> BTreeSet<String> {
    v.iter().map(|x| x.to_string()).collect()
}

#[test]
fn paths_resolve_to_the_longest_module_and_relative_ones_only_downwards() {
    let g = graph(&[
        ("", "pub mod a; pub mod b; pub use a::x::Y;"),
        (
            "a",
            "pub mod x; use crate::a::x::Y; use crate::b::Thing::method; fn f() { x::g(); b::h(); }",
        ),
        ("a::x", "use super::Z; use crate::b::c::deep; use std::io;"),
        ("b", "pub mod c;"),
        ("b::c", "use crate::nothing_here;"),
    ]);
    // Nesting is an edge; `b::h()` in `a` is no module of `a`'s.
    assert_eq!(g.edges["a"], set(&["a::x", "b"]));
    assert_eq!(g.edges["a::x"], set(&["a", "b::c"]));
    // The crate root is no node (`crate::nothing_here` is an item of lib.rs).
    assert!(!g.edges.contains_key("b::c"));
    assert!(!g.edges.contains_key(""));
    assert!(cycles(&g).is_empty());
    let a_x: Vec<(&str, usize)> = g
        .imports
        .iter()
        .filter(|i| i.from == "a::x")
        .map(|i| (i.to.as_str(), i.line))
        .collect();
    assert_eq!(a_x, [("a", 1), ("b::c", 1)]);
}

#[test]
fn a_cycle_is_found_and_printed_as_a_loop() {
    let g = graph(&[
        ("app", "use crate::runner::execute;"),
        ("runner", "fn f() { crate::probe::remote::execute(); }"),
        ("probe", "pub mod remote; pub mod reflect;"),
        (
            "probe::remote",
            "use crate::runner::RunOutcome; use super::reflect::x;",
        ),
        ("probe::reflect", "use crate::app::with_signals;"),
        ("stats", "use crate::app::x;"),
    ]);
    assert_eq!(
        cycles(&g),
        vec![s(&["app", "probe::reflect", "probe::remote", "runner"])]
    );
    assert_eq!(
        cycle_lines(&g),
        vec![
            "app -> runner -> probe::remote -> probe::reflect -> app",
            "probe::remote -> runner -> probe::remote",
        ]
    );
}

#[test]
fn a_cycle_through_an_ancestor_is_found_but_nesting_alone_is_none() {
    // probe -> export::registry -> options::continuous -> options (its
    // parent) -> options::plan (a re-export) -> probe.
    let g = graph(&[
        ("probe", "use crate::export::registry::R;"),
        ("export", "pub mod registry;"),
        ("export::registry", "use crate::options::continuous::C;"),
        ("options", "pub use self::plan::Plan; pub struct Shared;"),
        ("options::continuous", "use super::Shared;"),
        ("options::plan", "use crate::probe::Probe;"),
    ]);
    assert_eq!(
        cycle_lines(&g),
        vec![
            "export::registry -> options::continuous -> options -> options::plan -> probe \
             -> export::registry"
        ]
    );
    let nesting = graph(&[
        ("options", "pub use self::plan::Plan; pub struct Shared;"),
        ("options::plan", "use super::Shared;"),
    ]);
    assert_eq!(nesting.edges["options"], set(&["options::plan"]));
    assert_eq!(nesting.edges["options::plan"], set(&["options"]));
    assert!(cycles(&nesting).is_empty());
    assert!(cycle_lines(&nesting).is_empty());
    // Inside one top-level module a loop needs two unrelated steps: a
    // parent's re-export and a child's `super::` do not close one, a
    // sibling loop does.
    let inside = graph(&[
        ("sys", "pub use self::real::Real; pub trait Sys {}"),
        ("sys::real", "use super::tc::Qdisc;"),
        ("sys::tc", "use super::Sys; use super::netns::enter;"),
        ("sys::netns", "use super::tc::Qdisc;"),
    ]);
    assert_eq!(
        cycle_lines(&inside),
        vec!["sys::netns -> sys::tc -> sys::netns"]
    );
    assert_eq!(cycles(&inside), vec![s(&["sys::netns", "sys::tc"])]);
}

#[test]
fn an_acyclic_graph_has_no_cycle_and_two_loops_are_two_components() {
    let chain = graph(&[
        ("a", "use crate::b::X;"),
        ("b", "use crate::c::Y;"),
        ("c", ""),
    ]);
    assert!(cycle_lines(&chain).is_empty());
    let two = graph(&[
        ("a", "use crate::b::X;"),
        ("b", "use crate::a::Y;"),
        ("c", "use crate::d::X;"),
        ("d", "use crate::c::Y;"),
    ]);
    assert_eq!(cycles(&two).len(), 2);
    assert_eq!(cycle_lines(&two), vec!["a -> b -> a", "c -> d -> c"]);
}

const PAGE: &str = "# Architecture\n\n## The layers\n\nText.\n\n```text\n\
    app, signals:  the commands\n\
    cli:           clap: definitions\n\
    probe:         sockets\n\
    export, stats: outputs; figures\n\
    model:         the leaf\n\
    ```\n\n## Where each concern lives\n\n```text\nnot: a layer\n```\n";

#[test]
fn the_layer_table_is_read_from_its_block() {
    let l = Layers::from_markdown(PAGE).unwrap();
    assert_eq!(
        l.rows,
        vec![
            s(&["app", "signals"]),
            s(&["cli"]),
            s(&["probe"]),
            s(&["export", "stats"]),
            s(&["model"]),
        ]
    );
    assert_eq!(l.row("export"), Some(3));
    assert_eq!(l.row("not"), None);
    assert!(Layers::from_markdown("# No table").is_err());
    assert!(Layers::from_markdown("## The layers\n```\nno colon\n```").is_err());
    assert!(Layers::from_markdown("## The layers\n```\nBad Name: x\n```").is_err());
    assert!(Layers::from_markdown("## The layers\n```\n```").is_err());
}

#[test]
fn an_import_up_the_table_or_within_a_row_breaks_the_layers() {
    let layers = Layers::from_markdown(PAGE).unwrap();
    let g = graph(&[
        (
            "app",
            "use crate::probe::x;\nuse crate::model::y;\nuse crate::signals::z;",
        ),
        ("signals", ""),
        ("cli", "use clap::Args;"),
        ("probe", "pub mod remote;"),
        (
            "probe::remote",
            "use super::x;\nfn f() {\n    crate::cli::Cli::parse();\n}",
        ),
        ("export", "use crate::stats::Summary;\nuse crate::model::R;"),
        ("stats", ""),
        (
            "model",
            "// crate::probe::x in a comment\n#[cfg(test)] mod t { use crate::app::x; }",
        ),
    ]);
    assert_eq!(
        violations(&g, &layers),
        vec![
            "app.rs:3: app -> signals (same row)",
            "export.rs:1: export -> stats (same row)",
            "probe/remote.rs:3: probe -> cli (up the table)",
        ]
    );
}

#[test]
fn a_module_missing_from_the_table_and_clap_below_the_options_break_the_layers() {
    let layers = Layers::from_markdown(PAGE).unwrap();
    let g = graph(&[
        ("runner", "use crate::model::x;"),
        ("runner::orchestrate", "use crate::app::y;"),
        ("model", "use crate::runner::z;"),
        ("probe", "fn f() {}\n#[derive(clap::ValueEnum)] enum E {}"),
        ("cli", "use clap::Parser;"),
    ]);
    assert_eq!(
        violations(&g, &layers),
        vec![
            "runner.rs: runner is not in the layer table",
            "probe.rs:2: probe names clap (only app, cli, options may)",
        ]
    );
}

#[test]
fn load_reads_a_tree_and_leaves_test_files_out() {
    let dir = std::env::temp_dir().join(format!("xtask-modgraph-{}", std::process::id()));
    let src = dir.join("crate/src");
    fs::create_dir_all(src.join("probe")).unwrap();
    let files = [
        (
            "lib.rs",
            "pub mod probe; pub mod model;\n#[cfg(test)]\nmod helpers;",
        ),
        ("probe/mod.rs", "//! Probe.\n\nuse crate::model::R;\n"),
        ("probe/tests.rs", "use crate::app::x;"),
        ("helpers.rs", "use crate::app::y;"),
        ("model.rs", "\n\nuse crate::probe::P;"),
    ];
    for (path, code) in files {
        fs::write(src.join(path), code).unwrap();
    }
    let g = load(&src).unwrap();
    fs::remove_dir_all(&dir).unwrap();
    assert_eq!(g.modules, set(&["", "model", "probe"]));
    assert_eq!(g.files["probe"], "crate/src/probe/mod.rs");
    let layers = Layers::from_markdown(PAGE).unwrap();
    assert_eq!(
        violations(&g, &layers),
        vec!["crate/src/model.rs:3: model -> probe (up the table)"]
    );
    assert_eq!(cycle_lines(&g), vec!["model -> probe -> model"]);
}

#[test]
fn test_files_are_left_out() {
    assert!(is_test_file(Path::new("options/tests.rs")));
    assert!(is_test_file(Path::new("sys/sys_tests.rs")));
    assert!(is_test_file(Path::new("testutil.rs")));
    assert!(!is_test_file(Path::new("probe/latest.rs")));
}
