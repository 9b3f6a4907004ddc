//! The import cycles of the file-level graph (Tarjan's strongly connected
//! components), each printed as the elementary loops that cover its edges.
//!
//! Two kinds of loop count: one between unrelated modules only (siblings,
//! cousins: `a::x -> a::y -> a::x`), and one that leaves its top-level
//! module, whatever its edges, nesting included (`probe -> export::m ->
//! options::c -> options -> options::plan -> probe`). A loop inside one
//! top-level module that needs a parent's re-export or a child's `super::`
//! is how Rust nests modules, and is not reported.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use super::{Graph, related, top};

/// Which edges seed a loop, and which the loop may go back through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Seeds and way back: edges between unrelated modules only.
    Unrelated,
    /// Seeds: edges between two top-level modules; way back: any edge.
    AcrossTops,
}

impl Kind {
    fn seeds(self, u: &str, v: &str) -> bool {
        match self {
            Kind::Unrelated => !related(u, v),
            Kind::AcrossTops => top(u) != top(v),
        }
    }

    fn walks(self, u: &str, v: &str) -> bool {
        self == Kind::AcrossTops || !related(u, v)
    }
}

/// The graph with only the edges a loop of `kind` may use.
fn restricted(g: &Graph, kind: Kind) -> Graph {
    let mut r = g.clone();
    for (u, tos) in &mut r.edges {
        tos.retain(|v| kind.walks(u, v));
    }
    r
}

/// The strongly connected components of more than one module (Tarjan)
/// that hold a loop of either kind (see the module docs), each sorted, in
/// the order of their smallest module. (The tests' view of the loops.)
#[cfg(test)]
pub fn cycles(g: &Graph) -> Vec<Vec<String>> {
    let mut out: Vec<Vec<String>> = [Kind::Unrelated, Kind::AcrossTops]
        .into_iter()
        .flat_map(|kind| {
            let r = restricted(g, kind);
            components(&r)
                .into_iter()
                .filter(|c| has_seed(&r, c, kind))
                .collect::<Vec<_>>()
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

/// The strongly connected components of more than one module.
fn components(g: &Graph) -> Vec<Vec<String>> {
    struct Tarjan<'a> {
        g: &'a Graph,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        found: Vec<Vec<String>>,
    }
    impl<'a> Tarjan<'a> {
        fn visit(&mut self, v: &'a str) {
            let n = self.index.len();
            self.index.insert(v, n);
            self.low.insert(v, n);
            self.stack.push(v);
            self.on_stack.insert(v);
            for w in self.g.edges.get(v).into_iter().flatten() {
                let w = w.as_str();
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let lw = self.low[w];
                    let lv = self.low.get_mut(v).expect("visited");
                    *lv = (*lv).min(lw);
                } else if self.on_stack.contains(w) {
                    let iw = self.index[w];
                    let lv = self.low.get_mut(v).expect("visited");
                    *lv = (*lv).min(iw);
                }
            }
            if self.low[v] == self.index[v] {
                let mut comp = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack.remove(w);
                    comp.push(w.to_string());
                    if w == v {
                        break;
                    }
                }
                if comp.len() > 1 {
                    comp.sort();
                    self.found.push(comp);
                }
            }
        }
    }
    let mut t = Tarjan {
        g,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    let nodes: BTreeSet<&str> = g
        .modules
        .iter()
        .map(String::as_str)
        .chain(g.edges.keys().map(String::as_str))
        .collect();
    for v in nodes {
        if !t.index.contains_key(v) {
            t.visit(v);
        }
    }
    t.found.sort();
    t.found
}

/// Whether an edge inside `component` seeds a loop of `kind`.
#[cfg(test)]
fn has_seed(g: &Graph, component: &[String], kind: Kind) -> bool {
    component.iter().any(|u| {
        g.edges
            .get(u)
            .into_iter()
            .flatten()
            .any(|v| component.contains(v) && kind.seeds(u, v))
    })
}

/// Elementary cycles of one component of `g` (restricted to `kind`) that
/// together use every edge inside it that seeds a loop of `kind`: for each
/// such edge not yet on a cycle, the edge and the shortest way back. Each
/// starts at its smallest module.
fn covering_cycles(g: &Graph, component: &[String], kind: Kind) -> Vec<Vec<String>> {
    let inside: BTreeSet<&str> = component.iter().map(String::as_str).collect();
    let next = |v: &str| -> Vec<&str> {
        g.edges
            .get(v)
            .into_iter()
            .flatten()
            .map(String::as_str)
            .filter(|w| inside.contains(w))
            .collect()
    };
    let mut covered: BTreeSet<(String, String)> = BTreeSet::new();
    let mut out: Vec<Vec<String>> = Vec::new();
    for &u in &inside {
        for v in next(u) {
            if !kind.seeds(u, v) || covered.contains(&(u.to_string(), v.to_string())) {
                continue;
            }
            let Some(back) = shortest_path(v, u, &next) else {
                continue;
            };
            let mut cycle: Vec<String> = std::iter::once(u.to_string())
                .chain(back.iter().map(|s| s.to_string()))
                .collect();
            cycle.pop(); // `back` ends at `u` again
            for k in 0..cycle.len() {
                let to = &cycle[(k + 1) % cycle.len()];
                covered.insert((cycle[k].clone(), to.clone()));
            }
            let start = (0..cycle.len())
                .min_by_key(|&k| &cycle[k])
                .unwrap_or_default();
            cycle.rotate_left(start);
            if !out.contains(&cycle) {
                out.push(cycle);
            }
        }
    }
    out.sort();
    out
}

/// The shortest path from `from` to `to` (both included), breadth first.
fn shortest_path<'a>(
    from: &'a str,
    to: &'a str,
    next: &dyn Fn(&str) -> Vec<&'a str>,
) -> Option<Vec<&'a str>> {
    let mut came_from: BTreeMap<&str, &str> = BTreeMap::new();
    let mut queue = VecDeque::from([from]);
    let mut seen = BTreeSet::from([from]);
    while let Some(v) = queue.pop_front() {
        if v == to {
            let mut path = vec![v];
            let mut at = v;
            while let Some(&p) = came_from.get(at) {
                path.push(p);
                at = p;
            }
            path.reverse();
            return Some(path);
        }
        for w in next(v) {
            if seen.insert(w) {
                came_from.insert(w, v);
                queue.push_back(w);
            }
        }
    }
    None
}

/// Every loop of the graph (both kinds) as `a -> b -> c -> a` lines.
pub fn cycle_lines(g: &Graph) -> Vec<String> {
    let mut loops: Vec<Vec<String>> = Vec::new();
    for kind in [Kind::Unrelated, Kind::AcrossTops] {
        let r = restricted(g, kind);
        for c in components(&r) {
            for cycle in covering_cycles(&r, &c, kind) {
                if !loops.contains(&cycle) {
                    loops.push(cycle);
                }
            }
        }
    }
    loops.sort();
    loops
        .iter()
        .map(|cycle| {
            let mut parts = cycle.clone();
            parts.push(cycle[0].clone());
            parts.join(" -> ")
        })
        .collect()
}
