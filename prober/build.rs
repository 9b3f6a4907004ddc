//! Builds the XDP router's crate (`xdp-router`, target bpfel-unknown-none,
//! pinned nightly with `-Z build-std=core`, linked by bpf-linker) through
//! aya-build and leaves its objects in `$OUT_DIR`: `xdp-router` (the router
//! and the reflector, embedded by `src/ebpf`) and `xdp-bench` (the bench's
//! programs, embedded by `src/bench_forward/xdp.rs`) and `xdp-flows`
//! (`rtprobe flows`' sock_ops program, `src/ebpf/flows.rs`): a plain `cargo build` yields
//! a single binary.
//! When the tools are missing it stops with a message naming
//! `cargo xtask setup` instead of a wall of cargo output.

use std::{
    env,
    path::{Path, PathBuf},
    process::{Command, ExitCode},
};

use xdp_common::{BPF_LINKER_VERSION, EBPF_TOOLCHAIN};

const PROGRAM: &str = "xdp-router";
/// Every binary of the crate, each one object aya-build copies to OUT_DIR.
const OBJECTS: [&str; 3] = ["xdp-router", "xdp-bench", "xdp-flows"];

fn main() -> ExitCode {
    println!("cargo::rerun-if-env-changed=AYA_BUILD_SKIP");
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let manifest_dir =
        PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let program_dir = manifest_dir
        .parent()
        .expect("prober/ lives in the workspace")
        .join(PROGRAM);

    if skip_requested() {
        // Tools that only type-check (docs, IDEs) may set it. Leave an empty
        // object so the crate compiles; Router::load reports it at run time.
        for name in OBJECTS {
            let obj = out_dir.join(name);
            if let Err(e) = std::fs::write(&obj, []) {
                eprintln!("cannot write {}: {e}", obj.display());
                return ExitCode::FAILURE;
            }
        }
        println!("cargo::warning=AYA_BUILD_SKIP is set: rtprobe is built WITHOUT its XDP router");
        return ExitCode::SUCCESS;
    }

    if let Err(problem) = check_tools() {
        eprintln!(
            "\nerror: cannot build the XDP router (xdp-router): {problem}.\n\
             Install what is missing with `cargo xtask setup` (pinned nightly \
             {EBPF_TOOLCHAIN} with rust-src, bpf-linker {BPF_LINKER_VERSION}, apt packages), \
             then build again.\n"
        );
        return ExitCode::FAILURE;
    }

    // aya-build turns every line the nested cargo prints into a cargo
    // warning; keep it to diagnostics. SAFETY: single-threaded build script.
    unsafe { env::set_var("CARGO_TERM_QUIET", "true") };
    // aya-build watches xdp-router/; a dependency bump shows in the lock file.
    println!(
        "cargo::rerun-if-changed={}",
        manifest_dir.join("../Cargo.lock").display()
    );
    let root_dir = program_dir.to_string_lossy().into_owned();
    let package = aya_build::Package {
        name: PROGRAM,
        root_dir: &root_dir,
        ..Default::default()
    };
    match aya_build::build_ebpf([package], aya_build::Toolchain::Custom(EBPF_TOOLCHAIN)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!(
                "\nerror: building the XDP router failed: {e:#}\n\
                 Try `cargo xtask build-ebpf` to see the compiler output directly.\n"
            );
            ExitCode::FAILURE
        }
    }
}

fn skip_requested() -> bool {
    env::var("AYA_BUILD_SKIP").is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true"))
}

/// The tools aya-build needs, checked up front for a readable error.
fn check_tools() -> Result<(), String> {
    let linker = which::which("bpf-linker").map_err(|_| "bpf-linker is not on PATH".to_string())?;
    // A new bpf-linker (e.g. another LLVM) must rebuild the object.
    println!("cargo::rerun-if-changed={}", linker.display());
    match Command::new(&linker).arg("--version").output() {
        Ok(o) if o.status.success() => {
            let v = String::from_utf8_lossy(&o.stdout);
            let wanted = format!("bpf-linker {BPF_LINKER_VERSION}.");
            if !v.trim().starts_with(&wanted) {
                println!(
                    "cargo::warning={} is `{}`, expected {BPF_LINKER_VERSION}.x (cargo xtask setup installs it)",
                    linker.display(),
                    v.trim()
                );
            }
        }
        _ => return Err(format!("{} --version fails", linker.display())),
    }

    which::which("rustup")
        .map_err(|_| "rustup is not on PATH (the eBPF build needs rustup toolchains)")?;
    let sysroot = Command::new("rustup")
        .args(["run", EBPF_TOOLCHAIN, "rustc", "--print", "sysroot"])
        .output()
        .map_err(|e| format!("cannot run rustup: {e}"))?;
    if !sysroot.status.success() {
        return Err(format!("the toolchain {EBPF_TOOLCHAIN} is not installed"));
    }
    let sysroot = PathBuf::from(String::from_utf8_lossy(&sysroot.stdout).trim());
    if !has_rust_src(&sysroot) {
        return Err(format!(
            "the toolchain {EBPF_TOOLCHAIN} lacks the rust-src component (-Z build-std needs it)"
        ));
    }
    Ok(())
}

fn has_rust_src(sysroot: &Path) -> bool {
    sysroot
        .join("lib/rustlib/src/rust/library/core/Cargo.toml")
        .is_file()
}
