// Builds the web chat page: type-checks src/ with the library's tsc, bundles src/app.ts and
// herald-client (from its sources, protobuf included) with esbuild, and inlines the bundle
// into index.html, so Herald serves one self-contained page.
//
//   node build.mjs OUT_DIR     writes OUT_DIR/index.html (what Herald embeds) and OUT_DIR/app.js
//
// Files are rewritten only when their content changed: Herald's build embeds index.html, and
// a new modification time alone would rebuild it. Prints the bundle's size (min and
// min+gzip) on stderr. Needs clients/typescript installed (npm ci) with its protobuf code
// generated (npm run generate).
import { execFileSync } from "node:child_process";
import { existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { gzipSync } from "node:zlib";
import { build } from "esbuild";

const here = dirname(fileURLToPath(import.meta.url));
const library = resolve(here, "../../clients/typescript");
const out = resolve(process.argv[2] ?? "");
if (!process.argv[2]) {
  console.error("usage: node build.mjs OUT_DIR");
  process.exit(2);
}
if (!existsSync(join(library, "node_modules")) || !existsSync(join(library, "src/gen"))) {
  console.error(`build.mjs: ${library} is not ready: run npm ci and npm run generate there first`);
  process.exit(1);
}

// esbuild does not type-check; the library's own TypeScript does, against its sources.
execFileSync(join(library, "node_modules/.bin/tsc"), ["-p", join(here, "tsconfig.json")], { stdio: "inherit" });

const result = await build({
  entryPoints: [join(here, "src/app.ts")],
  tsconfig: join(here, "tsconfig.json"),
  bundle: true,
  minify: true,
  // An inline classic script: no module loading, runs once the elements above it exist.
  format: "iife",
  platform: "browser",
  // BigInt (ids and seqs are 64-bit) needs ES2020.
  target: "es2020",
  legalComments: "none",
  write: false,
  logLevel: "warning",
});
const js = result.outputFiles[0].text;
// Inlined in HTML, a "</script" in a string would end the element early.
const inline = js.replace(/<\/(script)/gi, "<\\/$1");
const template = readFileSync(join(here, "index.html"), "utf8");
const tag = '<script src="app.js"></script>';
if (!template.includes(tag)) throw new Error(`index.html has no ${tag} to replace`);
const page = template.replace(tag, () => `<script>${inline}</script>`);

mkdirSync(out, { recursive: true });
writeIfChanged(join(out, "app.js"), js);
writeIfChanged(join(out, "index.html"), page);

const bytes = Buffer.byteLength(js);
const gzip = gzipSync(js, { level: 9 }).byteLength;
const kib = (n) => `${(n / 1024).toFixed(1)} KiB`;
console.error(
  `web page: ${join(out, "index.html")}; bundle (herald-client with protobuf + the page) ` +
    `${kib(bytes)} min, ${kib(gzip)} min+gzip (target <= 30 KiB: ${gzip <= 30 * 1024 ? "met" : "MISSED"})`,
);

function writeIfChanged(path, content) {
  if (existsSync(path) && readFileSync(path, "utf8") === content) return;
  writeFileSync(path, content);
}
