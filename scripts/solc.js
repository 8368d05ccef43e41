#!/usr/bin/env node
// A `solc`-compatible front end over the npm WASM compiler, for py-solc-x and forge.
// Why not `solcjs`: it prints an SMT-solver notice on stdout before the JSON, which breaks
// every caller that parses stdout. This script answers exactly the calls our tools make:
//   solc --version
//   solc --standard-json [--base-path P] [--allow-paths A,B] [--include-path P]   (JSON on stdin)
'use strict';
const fs = require('fs');
const path = require('path');

const argv = process.argv.slice(2);
const solc = require(path.join(__dirname, '..', 'node_modules', 'solc'));

function optionValues(name) {
  const out = [];
  for (let i = 0; i < argv.length; i++) {
    if (argv[i] === name && i + 1 < argv.length) out.push(...argv[i + 1].split(','));
    else if (argv[i].startsWith(name + '=')) out.push(...argv[i].slice(name.length + 1).split(','));
  }
  return out;
}

if (argv.includes('--version')) {
  // py-solc-x parses "Version: X.Y.Z+commit.HASH".
  process.stdout.write('solc, the solidity compiler commandline interface\nVersion: ' + solc.version() + '\n');
  process.exit(0);
}

if (!argv.includes('--standard-json')) {
  process.stderr.write('scripts/solc.js supports only --version and --standard-json (JSON on stdin).\n');
  process.exit(2);
}

const roots = [...optionValues('--base-path'), ...optionValues('--include-path'), ...optionValues('--allow-paths'), process.cwd()];

function findImports(importPath) {
  const candidates = path.isAbsolute(importPath) ? [importPath] : roots.map((r) => path.resolve(r, importPath));
  for (const candidate of candidates) {
    if (fs.existsSync(candidate) && fs.statSync(candidate).isFile()) {
      return { contents: fs.readFileSync(candidate, 'utf8') };
    }
  }
  return { error: 'File not found: ' + importPath + ' (searched ' + roots.join(', ') + ')' };
}

const input = fs.readFileSync(0, 'utf8');
process.stdout.write(solc.compile(input, { import: findImports }));
