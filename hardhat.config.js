// Hardhat 2 configuration that works offline on Node 20.
// The compiler is the npm `solc` WASM build (hardhat would otherwise download one), with the
// settings from contracts/compiler.json, the same file protocol/compile.py reads, so both tool
// chains emit identical bytecode (tests/foundation/test_hardhat.py checks it).
const path = require("path");
const { subtask } = require("hardhat/config");
const { TASK_COMPILE_SOLIDITY_GET_SOLC_BUILD } = require("hardhat/builtin-tasks/task-names");

const compiler = require("./contracts/compiler.json");

subtask(TASK_COMPILE_SOLIDITY_GET_SOLC_BUILD, async (args, hre, runSuper) => {
  if (args.solcVersion !== compiler.version) return runSuper();
  const solcjs = require("solc");
  return {
    compilerPath: require.resolve("solc/soljson.js"),
    isSolcJs: true,
    version: args.solcVersion,
    longVersion: solcjs.version(),
  };
});

const testnet = {};
if (process.env.VTRAIN_RPC_URL) testnet.url = process.env.VTRAIN_RPC_URL;
if (process.env.VTRAIN_PRIVATE_KEY) testnet.accounts = [process.env.VTRAIN_PRIVATE_KEY];

/** @type import('hardhat/config').HardhatUserConfig */
module.exports = {
  solidity: { version: compiler.version, settings: compiler.settings },
  paths: { sources: "./contracts", artifacts: "./artifacts", cache: "./cache" },
  networks: {
    anvil: { url: "http://127.0.0.1:8545" },
    // URL and key come from the environment; hardhat refuses to use this network without a URL.
    testnet: { url: testnet.url || "http://127.0.0.1:8545", accounts: testnet.accounts || [] },
  },
};
