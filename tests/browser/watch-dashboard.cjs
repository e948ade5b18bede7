// Opens a kvmesh dashboard once, in headless Chromium driven by playwright-core, and prints
// the nodes the page lists each time that list changes: one line `nodes a,b,c`. It never
// reloads the page, so a change seen here is the page updating itself.
//
//   NODE_PATH=target/deploy-tools/browser/node_modules node tests/browser/watch-dashboard.cjs URL
//
// Runs until SIGTERM (then closes the browser) or for at most 120 s. CHROMIUM names the
// browser executable [default: chromium on PATH].
"use strict";
const { chromium } = require("playwright-core");
const { execFileSync } = require("node:child_process");

const url = process.argv[2];
if (!url) {
  console.error("usage: watch-dashboard.cjs URL");
  process.exit(2);
}
const executablePath =
  process.env.CHROMIUM || execFileSync("sh", ["-c", "command -v chromium"]).toString().trim();

(async () => {
  // --no-sandbox: tests may run as root, where Chromium refuses its sandbox.
  const browser = await chromium.launch({ executablePath, args: ["--no-sandbox"] });
  const stop = async () => {
    await browser.close();
    process.exit(0);
  };
  process.on("SIGTERM", stop);
  const page = await browser.newPage();
  await page.goto(url);
  const deadline = Date.now() + 120000;
  let last = null;
  while (Date.now() < deadline) {
    const nodes = await page.$$eval("#nodes tr", (rows) => rows.map((row) => row.dataset.node));
    const line = "nodes " + nodes.join(",");
    if (line !== last) {
      console.log(line);
      last = line;
    }
    await page.waitForTimeout(100);
  }
  await stop();
})().catch((error) => {
  console.error(error);
  process.exit(1);
});
