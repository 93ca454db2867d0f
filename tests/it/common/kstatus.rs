//! What GitOps tools make of an object: kstatus (Flux, kpt, cli-utils appliers) and Argo CD's
//! health check (`config/argocd/health.lua`), each run for real.
//!
//! - kstatus: `tools/kstatus` wraps `sigs.k8s.io/cli-utils` kstatus `status.Compute` (built once
//!   by `tools/kstatus/build.sh` into the binary cache; needs Go, as the control plane does).
//!   Override with `BP_KSTATUS=/path/to/kstatus`.
//! - health.lua runs in `lua5.1` (Debian package `lua5.1`; Argo CD runs gopher-lua, a Lua 5.1)
//!   inside a sandbox that mirrors Argo CD's: only the base, table and os libraries, no string
//!   or math library, not even as string methods. Override with `BP_LUA=/path/to/lua`.
//!
//! A missing checker or interpreter fails the tests; nothing is skipped.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use backpressure_envtest::repo_root;
use serde_json::{Value, json};

/// The kstatus checker: `$BP_KSTATUS`, or built (once, cached) by tools/kstatus/build.sh.
fn kstatus_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        if let Some(p) = std::env::var_os("BP_KSTATUS") {
            let p = PathBuf::from(p);
            assert!(p.is_file(), "BP_KSTATUS={} does not exist", p.display());
            return p;
        }
        let script = repo_root().join("tools/kstatus/build.sh");
        let out = Command::new("bash")
            .arg(&script)
            .stderr(Stdio::inherit())
            .output()
            .unwrap_or_else(|e| panic!("running {}: {e}", script.display()));
        assert!(
            out.status.success(),
            "{} failed: the kstatus check needs Go (as `make k8s-bins` does) or BP_KSTATUS",
            script.display()
        );
        let text = String::from_utf8(out.stdout).unwrap();
        PathBuf::from(text.lines().last().unwrap().trim())
    })
    .clone()
}

/// kstatus `status.Compute` of each object: (status, message).
pub fn kstatus(objects: &[Value]) -> Vec<(String, String)> {
    let mut child = Command::new(kstatus_bin())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(serde_json::to_string(objects).unwrap().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "kstatus: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let results: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(results.len(), objects.len());
    results
        .iter()
        .map(|r| {
            (
                r["status"].as_str().unwrap().to_owned(),
                r["message"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

fn lua_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("BP_LUA") {
        let p = PathBuf::from(p);
        assert!(p.is_file(), "BP_LUA={} does not exist", p.display());
        return p;
    }
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join("lua5.1"))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "lua5.1 not found on PATH: install the Debian package `lua5.1` (`make deps` \
                 does) or set BP_LUA; the Argo CD health check cannot be tested without it"
            )
        })
}

/// A Lua expression building `v` (JSON null becomes nil, as Argo CD's decodeValue does).
fn lua_literal(v: &Value, out: &mut String) {
    match v {
        Value::Null => out.push_str("nil"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => out.push_str(&n.to_string()),
        Value::String(s) => lua_string(s, out),
        Value::Array(items) => {
            out.push('{');
            for i in items {
                lua_literal(i, out);
                out.push_str(", ");
            }
            out.push('}');
        }
        Value::Object(map) => {
            out.push('{');
            for (k, v) in map {
                out.push('[');
                lua_string(k, out);
                out.push_str("] = ");
                lua_literal(v, out);
                out.push_str(", ");
            }
            out.push('}');
        }
    }
}

fn lua_string(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            // Control characters as decimal escapes; other characters (UTF-8 included) as is,
            // since Lua strings are bytes.
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                let _ = write!(out, "\\{:03}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Runs config/argocd/health.lua on `obj` as Argo CD does: global `obj`, only the base, table
/// and (safe) os libraries. Returns (status, message).
pub fn argocd_health(obj: &Value) -> (String, String) {
    let health = repo_root().join("config/argocd/health.lua");
    let mut literal = String::new();
    lua_literal(obj, &mut literal);
    let script = format!(
        r#"
local obj = {literal}
local env = {{}}
for _, k in ipairs({{"assert", "error", "ipairs", "next", "pairs", "pcall", "rawequal", "rawget",
  "rawset", "select", "setmetatable", "getmetatable", "tonumber", "tostring", "type", "unpack",
  "xpcall", "_VERSION"}}) do
  env[k] = _G[k]
end
env.table = table
env.os = {{ time = os.time, date = os.date, clock = os.clock }}
env.obj = obj
env._G = env
local chunk = assert(loadfile({path}))
setfenv(chunk, env)
-- Argo CD's VM does not open the string library: no string methods either.
local string_mt = getmetatable("")
string_mt.__index = nil
local ok, hs = pcall(chunk)
string_mt.__index = string
if not ok then
  io.stderr:write("health.lua failed: " .. tostring(hs) .. "\n")
  os.exit(2)
end
if type(hs) ~= "table" then
  io.stderr:write("health.lua returned a " .. type(hs) .. ", not a table\n")
  os.exit(3)
end
io.write(tostring(hs.status), "\n", tostring(hs.message), "\n")
"#,
        path = {
            let mut p = String::new();
            lua_string(&health.display().to_string(), &mut p);
            p
        }
    );
    let out = Command::new(lua_bin())
        .arg("-")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            c.stdin.take().unwrap().write_all(script.as_bytes())?;
            c.wait_with_output()
        })
        .unwrap();
    assert!(
        out.status.success(),
        "lua: {}\nobject: {obj}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let (status, message) = text.split_once('\n').unwrap();
    let status = status.to_owned();
    assert!(
        [
            "Healthy",
            "Progressing",
            "Degraded",
            "Suspended",
            "Missing",
            "Unknown"
        ]
        .contains(&status.as_str()),
        "Argo CD rejects health status {status:?}"
    );
    (status, message.trim_end().to_owned())
}

#[test]
fn lua_literals_round_trip_through_lua() {
    // The JSON → Lua conversion, checked by Lua itself.
    let v = json!({"a": [1, 2.5, "x\"y\\z\n"], "b": null, "c": {"d": true}, "é": "≤"});
    let mut lit = String::new();
    lua_literal(&v, &mut lit);
    let script = format!(
        "local v = {lit}\nio.write(#v.a, '|', v.a[2], '|', v.a[3], '|', tostring(v.b), '|', tostring(v.c.d), '|', v['é'])"
    );
    let out = Command::new(lua_bin())
        .args(["-e", &script])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        "3|2.5|x\"y\\z\n|nil|true|≤"
    );
}
