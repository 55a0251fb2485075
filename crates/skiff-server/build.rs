//! skiffd is linked with every dynamic symbol bound at start (`-z now`)
//! and its relocations read-only after (`-z relro`): the hardening
//! Debian gives its daemons, and each connection process, forked from a
//! zygote that has bound them already, resolves nothing of its own.

fn main() {
    println!("cargo:rustc-link-arg-bin=skiffd=-Wl,-z,relro,-z,now");
}
