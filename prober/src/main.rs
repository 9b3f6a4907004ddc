//! rtprobe: thin entry point; everything lives in the library.

fn main() -> std::process::ExitCode {
    rtprobe::main_entry()
}
