//! The import cycles of the file-level graph (Tarjan's strongly connected
//! components), each printed as the elementary loops that cover its edges.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use super::{Graph, related};

/// The strongly connected components of more than one module (Tarjan)
/// that hold an edge between two unrelated modules (not only nesting),
/// each sorted, in the order of their smallest module.
pub fn cycles(g: &Graph) -> Vec<Vec<String>> {
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
    t.found.retain(|c| has_crossing_edge(g, c));
    t.found.sort();
    t.found
}

/// Whether an edge inside `component` joins two unrelated modules.
fn has_crossing_edge(g: &Graph, component: &[String]) -> bool {
    component.iter().any(|u| {
        g.edges
            .get(u)
            .into_iter()
            .flatten()
            .any(|v| component.contains(v) && !related(u, v))
    })
}

/// Elementary cycles of one component that together use every edge inside
/// it between unrelated modules: for each such edge not yet on a cycle,
/// the edge and the shortest way back (nesting edges included). Each
/// starts at its smallest module.
pub fn covering_cycles(g: &Graph, component: &[String]) -> Vec<Vec<String>> {
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
            if related(u, v) || covered.contains(&(u.to_string(), v.to_string())) {
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

/// Every cycle of the graph as `a -> b -> c -> a` lines ("" for the crate root).
pub fn cycle_lines(g: &Graph) -> Vec<String> {
    let name = |m: &str| {
        if m.is_empty() {
            "crate".to_string()
        } else {
            m.to_string()
        }
    };
    cycles(g)
        .iter()
        .flat_map(|c| covering_cycles(g, c))
        .map(|cycle| {
            let mut parts: Vec<String> = cycle.iter().map(|m| name(m)).collect();
            parts.push(name(&cycle[0]));
            parts.join(" -> ")
        })
        .collect()
}
