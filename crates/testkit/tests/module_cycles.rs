//! Structure checks that run as ordinary tests: no import cycle between the files
//! of any workspace crate (the arrows of the module rule, resolved with `syn`),
//! and no hand-written source file over 1,200 lines.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fs;
use std::path::{Path, PathBuf};

use syn::visit::Visit;

/// The most lines a hand-written source file may have.
const MAX_LINES: usize = 1200;

/// File endings that count as source for the length check.
const SOURCE_ENDINGS: &[&str] = &["rs", "c", "cc", "cpp", "cu", "cuh", "h", "py", "sh"];

/// The folders of a package whose files the length check reads.
const SOURCE_FOLDERS: &[&str] = &["src", "tests", "benches", "examples"];

// --- the two checks over the real tree ----------------------------------------

#[test]
fn no_crate_has_a_module_cycle() {
    let mut findings = Vec::new();
    for package in workspace_packages() {
        let sources = read_rust_sources(&package.dir.join("src"));
        let graph = FileGraph::build(&sources);
        for cycle in graph.cycles() {
            findings.push(format!("{}: {cycle}", package.name));
        }
    }
    assert!(
        findings.is_empty(),
        "{} module cycle(s) (an arrow is a private `use` or an inline path into another file):\n{}",
        findings.len(),
        findings.join("\n")
    );
}

#[test]
fn no_source_file_is_over_the_line_limit() {
    let root = cumux_testkit::workspace_root();
    let mut folders: Vec<PathBuf> = workspace_packages()
        .iter()
        .flat_map(|package| SOURCE_FOLDERS.iter().map(|folder| package.dir.join(folder)))
        .collect();
    folders.push(root.join("tests"));
    let mut too_long = Vec::new();
    for folder in folders {
        for file in files_under(&folder) {
            let ending = file.extension().and_then(|ext| ext.to_str()).unwrap_or("");
            if !SOURCE_ENDINGS.contains(&ending) {
                continue;
            }
            let Ok(text) = fs::read_to_string(&file) else {
                continue;
            };
            if is_generated(&text) {
                continue;
            }
            let lines = text.lines().count();
            if lines > MAX_LINES {
                let shown = file
                    .strip_prefix(&root)
                    .unwrap_or(&file)
                    .display()
                    .to_string();
                too_long.push(format!("{shown}: {lines} lines"));
            }
        }
    }
    too_long.sort();
    assert!(
        too_long.is_empty(),
        "{} source file(s) over {MAX_LINES} lines (split them by job):\n{}",
        too_long.len(),
        too_long.join("\n")
    );
}

/// A file is generated when its first line says `@generated`.
fn is_generated(text: &str) -> bool {
    text.lines()
        .next()
        .is_some_and(|line| line.contains("@generated"))
}

// --- the workspace on disk ----------------------------------------------------

/// One member of the workspace: its package name and folder.
struct Package {
    name: String,
    dir: PathBuf,
}

/// The members listed in the root `Cargo.toml`, each with its package name.
fn workspace_packages() -> Vec<Package> {
    let root = cumux_testkit::workspace_root();
    let manifest = fs::read_to_string(root.join("Cargo.toml")).expect("root Cargo.toml");
    let members = manifest
        .split_once("members")
        .and_then(|(_, rest)| rest.split_once('['))
        .and_then(|(_, rest)| rest.split_once(']'))
        .map(|(list, _)| list)
        .expect("[workspace] members = [...]");
    let packages: Vec<Package> = quoted_strings(members)
        .into_iter()
        .map(|member| {
            let dir = root.join(member);
            let own = fs::read_to_string(dir.join("Cargo.toml"))
                .unwrap_or_else(|err| panic!("{}: {err}", dir.display()));
            let name = own
                .lines()
                .find_map(|line| line.trim().strip_prefix("name"))
                .and_then(|rest| quoted_strings(rest).into_iter().next())
                .unwrap_or(member)
                .to_string();
            Package { name, dir }
        })
        .collect();
    assert!(!packages.is_empty(), "the workspace lists no members");
    packages
}

/// The `"..."` strings of a piece of TOML, in order.
fn quoted_strings(text: &str) -> Vec<&str> {
    text.split('"').skip(1).step_by(2).collect()
}

/// Every file below `dir`, sorted; none when it does not exist.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(folder) = pending.pop() {
        let Ok(entries) = fs::read_dir(&folder) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            match entry.file_type() {
                Ok(kind) if kind.is_dir() => pending.push(path),
                Ok(kind) if kind.is_file() => files.push(path),
                _ => {}
            }
        }
    }
    files.sort();
    files
}

/// Every `.rs` file below `src`, keyed by its path relative to `src`.
fn read_rust_sources(src: &Path) -> BTreeMap<PathBuf, String> {
    files_under(src)
        .into_iter()
        .filter(|file| file.extension().is_some_and(|ext| ext == "rs"))
        .map(|file| {
            let text = fs::read_to_string(&file)
                .unwrap_or_else(|err| panic!("reading {}: {err}", file.display()));
            (file.strip_prefix(src).unwrap().to_path_buf(), text)
        })
        .collect()
}

// --- modules and the files they live in ---------------------------------------

/// One module of a crate's tree: a file module or an inline `mod x {}`.
struct Module {
    name: String,
    parent: Option<usize>,
    /// The file (relative to `src/`) whose text holds this module.
    file: PathBuf,
    /// Where `mod x;` inside this module looks for `x.rs` and `x/mod.rs`.
    child_dir: PathBuf,
    /// Whether this module is the top of its file (not an inline module).
    file_top: bool,
    children: BTreeMap<String, usize>,
    items: Vec<syn::Item>,
}

/// Where a module sits in the tree: its name and parent, the file holding its
/// text, and where its `mod x;` children are looked for.
struct Place<'a> {
    name: &'a str,
    parent: Option<usize>,
    file: PathBuf,
    child_dir: PathBuf,
}

/// Every module reachable from the crate roots (`lib.rs`, `main.rs`, `bin/*.rs`).
struct ModuleTree {
    modules: Vec<Module>,
}

impl ModuleTree {
    fn build(sources: &BTreeMap<PathBuf, String>) -> Self {
        let mut tree = ModuleTree {
            modules: Vec::new(),
        };
        let roots = sources.keys().filter(|file| {
            let in_bin = file.parent() == Some(Path::new("bin"));
            *file == Path::new("lib.rs") || *file == Path::new("main.rs") || in_bin
        });
        for root in roots {
            let dir = root.parent().unwrap_or(Path::new("")).to_path_buf();
            let at = Place {
                name: "crate",
                parent: None,
                file: root.clone(),
                child_dir: dir,
            };
            tree.add_file_module(sources, at);
        }
        tree
    }

    fn add_file_module(&mut self, sources: &BTreeMap<PathBuf, String>, at: Place<'_>) -> usize {
        let text = &sources[&at.file];
        let parsed = syn::parse_file(text)
            .unwrap_or_else(|err| panic!("parsing {}: {err}", at.file.display()));
        self.add_module(sources, at, true, parsed.items)
    }

    fn add_module(
        &mut self,
        sources: &BTreeMap<PathBuf, String>,
        at: Place<'_>,
        file_top: bool,
        items: Vec<syn::Item>,
    ) -> usize {
        let id = self.modules.len();
        let Place {
            name,
            parent,
            file,
            child_dir,
        } = at;
        self.modules.push(Module {
            name: name.to_string(),
            parent,
            file: file.clone(),
            child_dir: child_dir.clone(),
            file_top,
            children: BTreeMap::new(),
            items: Vec::new(),
        });
        for item in &items {
            let syn::Item::Mod(declared) = item else {
                continue;
            };
            let child_name = ident_text(&declared.ident);
            let child = match &declared.content {
                Some((_, inner)) => {
                    let at = Place {
                        name: &child_name,
                        parent: Some(id),
                        file: file.clone(),
                        child_dir: child_dir.join(&child_name),
                    };
                    self.add_module(sources, at, false, inner.clone())
                }
                None => {
                    let Some(child_file) =
                        self.child_file(sources, id, &child_name, &declared.attrs)
                    else {
                        continue; // a module whose file is not in src/ (cfg'd away, say)
                    };
                    let grandchild_dir = if path_attr(&declared.attrs).is_some()
                        || child_file.file_name() == Some("mod.rs".as_ref())
                    {
                        child_file.parent().unwrap_or(Path::new("")).to_path_buf()
                    } else {
                        child_file.with_extension("")
                    };
                    let at = Place {
                        name: &child_name,
                        parent: Some(id),
                        file: child_file,
                        child_dir: grandchild_dir,
                    };
                    self.add_file_module(sources, at)
                }
            };
            self.modules[id].children.insert(child_name, child);
        }
        self.modules[id].items = items;
        id
    }

    /// The file a `mod name;` declared in module `owner` loads.
    fn child_file(
        &self,
        sources: &BTreeMap<PathBuf, String>,
        owner: usize,
        name: &str,
        attrs: &[syn::Attribute],
    ) -> Option<PathBuf> {
        let owner = &self.modules[owner];
        if let Some(path) = path_attr(attrs) {
            let base = if owner.file_top {
                owner.file.parent().unwrap_or(Path::new("")).to_path_buf()
            } else {
                owner.child_dir.clone()
            };
            let file = normalize(&base.join(path));
            return sources.contains_key(&file).then_some(file);
        }
        [
            owner.child_dir.join(format!("{name}.rs")),
            owner.child_dir.join(name).join("mod.rs"),
        ]
        .into_iter()
        .find(|file| sources.contains_key(file))
    }

    /// Walks `segments` from module `from` the way rustc does for `crate::`,
    /// `self::`, `super::`, a child module or a module alias in scope, and
    /// returns the deepest module reached plus the first segment past it (or
    /// the module's own name when the path ends at a module). `None` when the
    /// path does not start inside this crate.
    fn resolve(
        &self,
        from: usize,
        aliases: &BTreeMap<String, usize>,
        segments: &[String],
    ) -> Option<(usize, String, bool)> {
        let first = segments.first()?;
        let mut current = match first.as_str() {
            "crate" => self.root_of(from),
            "self" => from,
            "super" => self.modules[from].parent?,
            name => match self.modules[from].children.get(name) {
                Some(&child) => child,
                None => *aliases.get(name)?,
            },
        };
        let mut next = 1;
        while let Some(segment) = segments.get(next) {
            let step = match segment.as_str() {
                "super" => self.modules[current].parent,
                "self" => Some(current),
                name => self.modules[current].children.get(name).copied(),
            };
            match step {
                Some(module) => current = module,
                None => break,
            }
            next += 1;
        }
        let ends_at_module = next == segments.len();
        let name = segments
            .get(next)
            .cloned()
            .unwrap_or_else(|| self.modules[current].name.clone());
        Some((current, name, ends_at_module))
    }

    fn root_of(&self, mut module: usize) -> usize {
        while let Some(parent) = self.modules[module].parent {
            module = parent;
        }
        module
    }
}

/// The string of a `#[path = "..."]` attribute, if any.
fn path_attr(attrs: &[syn::Attribute]) -> Option<String> {
    attrs.iter().find_map(|attr| match &attr.meta {
        syn::Meta::NameValue(pair) if pair.path.is_ident("path") => match &pair.value {
            syn::Expr::Lit(syn::ExprLit {
                lit: syn::Lit::Str(text),
                ..
            }) => Some(text.value()),
            _ => None,
        },
        _ => None,
    })
}

/// `a/./b/../c.rs` as `a/c.rs`.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            std::path::Component::CurDir => {}
            std::path::Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

fn ident_text(ident: &syn::Ident) -> String {
    let text = ident.to_string();
    text.strip_prefix("r#").map(str::to_string).unwrap_or(text)
}

// --- the arrows between files ---------------------------------------------------

/// One name a `use` tree brings in: its full path and the local name it binds
/// (`*` for a glob).
struct UseLeaf {
    path: Vec<String>,
    local: String,
}

fn flatten_use(tree: &syn::UseTree, prefix: &mut Vec<String>, out: &mut Vec<UseLeaf>) {
    match tree {
        syn::UseTree::Path(step) => {
            prefix.push(ident_text(&step.ident));
            flatten_use(&step.tree, prefix, out);
            prefix.pop();
        }
        syn::UseTree::Name(leaf) => push_leaf(prefix, &ident_text(&leaf.ident), None, out),
        syn::UseTree::Rename(leaf) => push_leaf(
            prefix,
            &ident_text(&leaf.ident),
            Some(ident_text(&leaf.rename)),
            out,
        ),
        syn::UseTree::Glob(_) => out.push(UseLeaf {
            path: prefix.clone(),
            local: "*".into(),
        }),
        syn::UseTree::Group(group) => {
            for tree in &group.items {
                flatten_use(tree, prefix, out);
            }
        }
    }
}

fn push_leaf(prefix: &[String], name: &str, rename: Option<String>, out: &mut Vec<UseLeaf>) {
    let mut path = prefix.to_vec();
    if name != "self" || path.is_empty() {
        path.push(name.to_string());
    }
    let local = rename.unwrap_or_else(|| path.last().cloned().unwrap_or_default());
    out.push(UseLeaf { path, local });
}

/// Arrows between the files of one crate, each with the names it carries.
struct FileGraph {
    arrows: BTreeMap<PathBuf, BTreeMap<PathBuf, BTreeSet<String>>>,
}

impl FileGraph {
    /// Parses the crate whose `src/` files are `sources` (paths relative to
    /// `src/`) and collects every arrow between two different files.
    fn build(sources: &BTreeMap<PathBuf, String>) -> Self {
        let tree = ModuleTree::build(sources);
        let mut graph = FileGraph {
            arrows: BTreeMap::new(),
        };
        for id in 0..tree.modules.len() {
            let aliases = module_aliases(&tree, id);
            let mut walker = ArrowWalker {
                tree: &tree,
                module: id,
                aliases: &aliases,
                found: Vec::new(),
            };
            for item in &tree.modules[id].items {
                walker.visit_item(item);
            }
            let from = &tree.modules[id].file;
            for (target, name) in walker.found {
                let to = &tree.modules[target].file;
                if to != from {
                    let names = graph.arrows.entry(from.clone()).or_default();
                    names.entry(to.clone()).or_default().insert(name);
                }
            }
        }
        graph
    }

    /// Every cycle among the files, one per arrow that lies on a cycle: the
    /// arrow followed by the shortest way back, written
    /// `a.rs -> b.rs (Names) -> a.rs (Names)` and starting at its least file.
    fn cycles(&self) -> Vec<String> {
        let mut seen = BTreeSet::new();
        let mut cycles = Vec::new();
        for component in self.strongly_connected() {
            if component.len() < 2 {
                continue;
            }
            for from in &component {
                for to in self.arrows[*from]
                    .keys()
                    .filter(|to| component.contains(to))
                {
                    let Some(back) = self.shortest_path(to, from, &component) else {
                        continue;
                    };
                    let mut ring: Vec<&PathBuf> = vec![from];
                    ring.extend(back.iter().take(back.len() - 1));
                    let least = (0..ring.len()).min_by_key(|&at| ring[at]).unwrap();
                    ring.rotate_left(least);
                    if seen.insert(ring.clone()) {
                        cycles.push(self.describe(&ring));
                    }
                }
            }
        }
        cycles
    }

    fn describe(&self, ring: &[&PathBuf]) -> String {
        let mut text = ring[0].display().to_string();
        for (at, from) in ring.iter().enumerate() {
            let to = ring[(at + 1) % ring.len()];
            let names: Vec<&str> = self.arrows[*from][to].iter().map(String::as_str).collect();
            text.push_str(&format!(" -> {} ({})", to.display(), names.join(", ")));
        }
        text
    }

    /// Breadth-first: the files from `start` to `goal` (both included),
    /// staying inside `within`.
    fn shortest_path<'a>(
        &'a self,
        start: &'a PathBuf,
        goal: &PathBuf,
        within: &BTreeSet<&PathBuf>,
    ) -> Option<Vec<&'a PathBuf>> {
        let mut came_from: BTreeMap<&PathBuf, &PathBuf> = BTreeMap::new();
        let mut queue = VecDeque::from([start]);
        let mut visited = BTreeSet::from([start]);
        while let Some(at) = queue.pop_front() {
            if at == goal {
                let mut path = vec![at];
                let mut step = at;
                while let Some(&before) = came_from.get(step) {
                    path.push(before);
                    step = before;
                }
                path.reverse();
                return Some(path);
            }
            for next in self.arrows.get(at).into_iter().flat_map(|to| to.keys()) {
                if within.contains(next) && visited.insert(next) {
                    came_from.insert(next, at);
                    queue.push_back(next);
                }
            }
        }
        None
    }

    /// Tarjan's strongly connected components of the file graph.
    fn strongly_connected(&self) -> Vec<BTreeSet<&PathBuf>> {
        let mut state = Tarjan {
            graph: self,
            next_index: 0,
            index: BTreeMap::new(),
            low: BTreeMap::new(),
            stack: Vec::new(),
            on_stack: BTreeSet::new(),
            components: Vec::new(),
        };
        for file in self.arrows.keys() {
            if !state.index.contains_key(file) {
                state.connect(file);
            }
        }
        state.components
    }
}

struct Tarjan<'a> {
    graph: &'a FileGraph,
    next_index: usize,
    index: BTreeMap<&'a PathBuf, usize>,
    low: BTreeMap<&'a PathBuf, usize>,
    stack: Vec<&'a PathBuf>,
    on_stack: BTreeSet<&'a PathBuf>,
    components: Vec<BTreeSet<&'a PathBuf>>,
}

impl<'a> Tarjan<'a> {
    fn connect(&mut self, file: &'a PathBuf) {
        self.index.insert(file, self.next_index);
        self.low.insert(file, self.next_index);
        self.next_index += 1;
        self.stack.push(file);
        self.on_stack.insert(file);
        let graph = self.graph;
        for next in graph.arrows.get(file).into_iter().flat_map(|to| to.keys()) {
            if !self.index.contains_key(next) {
                self.connect(next);
                let low = self.low[file].min(self.low[next]);
                self.low.insert(file, low);
            } else if self.on_stack.contains(next) {
                let low = self.low[file].min(self.index[next]);
                self.low.insert(file, low);
            }
        }
        if self.low[file] == self.index[file] {
            let mut component = BTreeSet::new();
            while let Some(member) = self.stack.pop() {
                self.on_stack.remove(member);
                component.insert(member);
                if member == file {
                    break;
                }
            }
            self.components.push(component);
        }
    }
}

/// The module names a module brings into scope with its own `use` items
/// (`use crate::device;`, `use super::shm as area;`), for inline paths that
/// start with them.
fn module_aliases(tree: &ModuleTree, module: usize) -> BTreeMap<String, usize> {
    let mut aliases = BTreeMap::new();
    for item in &tree.modules[module].items {
        let syn::Item::Use(import) = item else {
            continue;
        };
        if import.leading_colon.is_some() {
            continue;
        }
        let mut leaves = Vec::new();
        flatten_use(&import.tree, &mut Vec::new(), &mut leaves);
        for leaf in leaves {
            if let Some((target, _, true)) = tree.resolve(module, &BTreeMap::new(), &leaf.path) {
                if leaf.local != "*" {
                    aliases.insert(leaf.local, target);
                }
            }
        }
    }
    aliases
}

/// Finds the arrows out of one module: its private `use` items and the inline
/// paths in its code (also inside the arguments of function-like macros that
/// parse as expressions). Inline child modules are walked as their own module.
struct ArrowWalker<'a> {
    tree: &'a ModuleTree,
    module: usize,
    aliases: &'a BTreeMap<String, usize>,
    /// (target module, name used)
    found: Vec<(usize, String)>,
}

impl ArrowWalker<'_> {
    fn arrow_to(&mut self, segments: &[String]) {
        if let Some((target, name, _)) = self.tree.resolve(self.module, self.aliases, segments) {
            self.found.push((target, name));
        }
    }
}

impl<'ast> Visit<'ast> for ArrowWalker<'_> {
    fn visit_item_mod(&mut self, _: &'ast syn::ItemMod) {
        // Inline modules are modules of their own; file modules are not arrows.
    }

    fn visit_item_use(&mut self, import: &'ast syn::ItemUse) {
        let private = matches!(import.vis, syn::Visibility::Inherited);
        if !private || import.leading_colon.is_some() {
            return; // a re-export, or a path outside this crate
        }
        let mut leaves = Vec::new();
        flatten_use(&import.tree, &mut Vec::new(), &mut leaves);
        for leaf in leaves {
            let glob = leaf.local == "*";
            if let Some((target, name, _)) =
                self.tree.resolve(self.module, self.aliases, &leaf.path)
            {
                let name = if glob { format!("{name}::*") } else { name };
                self.found.push((target, name));
            }
        }
    }

    fn visit_visibility(&mut self, _: &'ast syn::Visibility) {
        // `pub(super)` and `pub(in crate::x)` name no item.
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        if path.leading_colon.is_none() && path.segments.len() > 1 {
            let segments: Vec<String> = path
                .segments
                .iter()
                .map(|segment| ident_text(&segment.ident))
                .collect();
            self.arrow_to(&segments);
        }
        syn::visit::visit_path(self, path);
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        syn::visit::visit_macro(self, mac);
        let parser = syn::punctuated::Punctuated::<syn::Expr, syn::Token![,]>::parse_terminated;
        if let Ok(arguments) = mac.parse_body_with(parser) {
            for argument in &arguments {
                self.visit_expr(argument);
            }
        }
    }
}

// --- the checker on small crates -------------------------------------------------

/// The cycles the checker lists for a crate of `(path under src/, text)` files.
fn cycles_in(files: &[(&str, &str)]) -> Vec<String> {
    FileGraph::build(&crate_of(files)).cycles()
}

fn crate_of(files: &[(&str, &str)]) -> BTreeMap<PathBuf, String> {
    files
        .iter()
        .map(|(path, text)| (PathBuf::from(path), text.to_string()))
        .collect()
}

#[test]
fn a_use_in_each_direction_is_a_cycle() {
    let files = [
        ("lib.rs", "mod a; mod b;"),
        ("a.rs", "use crate::b::Beta; pub struct Alpha;"),
        (
            "b.rs",
            "pub struct Beta; fn make() -> crate::a::Alpha { crate::a::Alpha }",
        ),
    ];
    assert_eq!(cycles_in(&files), ["a.rs -> b.rs (Beta) -> a.rs (Alpha)"]);
}

#[test]
fn a_re_export_is_not_an_arrow() {
    let sources = crate_of(&[
        (
            "lib.rs",
            "mod a; pub use a::Alpha; pub(crate) use a::Gamma; pub struct Root;",
        ),
        (
            "a.rs",
            "use crate::Root; pub struct Alpha; pub struct Gamma;",
        ),
    ]);
    let graph = FileGraph::build(&sources);
    assert!(graph.cycles().is_empty(), "{:?}", graph.cycles());
    let from_a = &graph.arrows[Path::new("a.rs")];
    assert_eq!(from_a.keys().collect::<Vec<_>>(), [Path::new("lib.rs")]);
    assert!(!graph.arrows.contains_key(Path::new("lib.rs")));
}

#[test]
fn a_mod_rs_using_its_child_that_uses_it_is_a_cycle() {
    let files = [
        ("lib.rs", "pub mod device;"),
        (
            "device/mod.rs",
            "mod worker; pub struct Config; fn start() { worker::Worker::run(Config); }",
        ),
        ("device/worker.rs", "use super::Config; pub struct Worker;"),
    ];
    assert_eq!(
        cycles_in(&files),
        ["device/mod.rs -> device/worker.rs (Worker) -> device/mod.rs (Config)"]
    );
}

#[test]
fn inline_modules_stay_in_their_file_and_are_no_arrow_to_it() {
    let sources = crate_of(&[
        ("lib.rs", "mod a; pub struct Root;"),
        (
            "a.rs",
            "pub struct Alpha;\n#[cfg(test)] mod tests { use super::*; use crate::Root; }",
        ),
    ]);
    let graph = FileGraph::build(&sources);
    assert_eq!(graph.arrows.len(), 1);
    let names = &graph.arrows[Path::new("a.rs")][Path::new("lib.rs")];
    assert_eq!(names.iter().collect::<Vec<_>>(), ["Root"]);
}

#[test]
fn path_attributes_macro_arguments_and_module_aliases_are_followed() {
    let files = [
        (
            "main.rs",
            "mod net; #[path = \"gen/table.rs\"] mod table; pub struct Main;",
        ),
        (
            "net.rs",
            "use crate::table; fn f() { println!(\"{:?}\", table::ROWS); }",
        ),
        (
            "gen/table.rs",
            "pub const ROWS: u32 = 1; fn g() -> crate::net::Net { todo!() }",
        ),
    ];
    assert_eq!(
        cycles_in(&files),
        ["gen/table.rs -> net.rs (Net) -> gen/table.rs (ROWS, table)"]
    );
}

#[test]
fn three_files_in_a_ring_are_one_cycle_and_a_longer_ring_lists_each_way_round() {
    let files = [
        ("lib.rs", "mod a; mod b; mod c;"),
        ("a.rs", "use crate::b::B; pub struct A;"),
        ("b.rs", "use crate::c::C; pub struct B;"),
        ("c.rs", "use crate::a::A; use crate::b::B; pub struct C;"),
    ];
    assert_eq!(
        cycles_in(&files),
        [
            "a.rs -> b.rs (B) -> c.rs (C) -> a.rs (A)",
            "b.rs -> c.rs (C) -> b.rs (B)",
        ]
    );
}

#[test]
fn generated_files_are_marked_on_their_first_line() {
    assert!(is_generated("// @generated by gen.py\nfn f() {}"));
    assert!(!is_generated("fn f() {}\n// @generated"));
}
