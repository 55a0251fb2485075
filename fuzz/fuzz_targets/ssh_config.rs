//! Fuzz target: arbitrary bytes (lossy UTF-8) through the ssh_config parser,
//! resolver and token expander. Nothing may panic, errors must point at a real
//! line, and resolution must terminate even when every `Include` loops back.

#![no_main]

use libfuzzer_sys::fuzz_target;
use skiff_proto::ssh_config::{
    expand_tokens, parse, parse_jump_hosts, parse_options, resolve, ConfigError, ConfigFile,
    MatchContext, TokenContext,
};

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let line_count = text.lines().count();

    // A ProxyJump value: hops parse back to what was written, or fail.
    if let Ok(hops) = parse_jump_hosts(&text) {
        assert_eq!(hops.len(), text.split(',').count());
        assert!(hops.iter().all(|h| !h.host.is_empty() && h.port != Some(0)));
    }

    let contexts = [
        MatchContext {
            original_host: "web1.example.com".into(),
            host: "web1.example.com".into(),
            remote_user: None,
            local_user: "alice".into(),
        },
        MatchContext {
            original_host: "Alias".into(),
            host: "10.0.0.1".into(),
            remote_user: Some("root".into()),
            local_user: "bob".into(),
        },
    ];

    match parse("fuzz", &text) {
        Ok(file) => {
            assert!(file.len() <= line_count);
            for ctx in &contexts {
                // Includes that find nothing.
                let mut none =
                    |_: &str, _: &str| -> Result<Vec<ConfigFile>, ConfigError> { Ok(Vec::new()) };
                if let Err(e) = resolve(std::slice::from_ref(&file), ctx, &mut none) {
                    assert_eq!(e.file, "fuzz");
                    assert!(e.line >= 1 && e.line <= line_count);
                    let _ = e.to_string();
                }

                // Includes that load the file itself again: must hit the depth
                // limit rather than recurse forever. Bound the total work so
                // inputs with many `Include` lines stay fast.
                let mut calls = 0usize;
                let mut again = |_: &str, _: &str| -> Result<Vec<ConfigFile>, ConfigError> {
                    calls += 1;
                    if calls > 64 {
                        Ok(Vec::new())
                    } else {
                        Ok(vec![file.clone()])
                    }
                };
                if let Ok(cfg) = resolve(std::slice::from_ref(&file), ctx, &mut again) {
                    for f in &cfg.identity_files {
                        let _ = expand_tokens(f, &tokens());
                    }
                }
            }
        }
        Err(e) => {
            assert_eq!(e.file, "fuzz");
            assert!(e.line >= 1 && e.line <= line_count);
            let _ = e.to_string();
        }
    }

    // Every line as a `-o` option.
    let options: Vec<String> = text.lines().map(str::to_owned).collect();
    match parse_options(&options) {
        Ok(file) => {
            let mut none =
                |_: &str, _: &str| -> Result<Vec<ConfigFile>, ConfigError> { Ok(Vec::new()) };
            let _ = resolve(&[file], &contexts[0], &mut none);
        }
        Err(e) => {
            assert_eq!(e.file, "command line");
            assert!(e.line >= 1 && e.line <= options.len());
        }
    }

    // Token expansion of the whole input and of each line.
    let t = tokens();
    let _ = expand_tokens(&text, &t);
    for line in text.lines().take(64) {
        if let Ok(out) = expand_tokens(line, &t) {
            if !line.contains('%') && !line.starts_with('~') {
                assert_eq!(out, line);
            }
        }
    }
});

fn tokens() -> TokenContext {
    TokenContext {
        host: "web1.example.com".into(),
        original_host: "web1".into(),
        remote_user: "root".into(),
        local_user: "alice".into(),
        port: 22,
        home: "/home/alice".into(),
        local_hostname: "laptop.lan".into(),
        uid: 1000,
    }
}
