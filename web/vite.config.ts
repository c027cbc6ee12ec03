// The build of the web app into the Python package (simrun_api/ui), which the service serves at
// /ui/. The output is a function of the sources and package-lock.json only: file names carry a
// hash of their content (no time, no random part), no source maps with absolute paths, so
// `npm ci && npm run build` on any machine writes the files committed (checked by .ci/run).
import vue from "@vitejs/plugin-vue";
import { defineConfig } from "vite";

// The API of the service for the dev server: SIMRUN_URL, else the default port of the service.
const service = process.env.SIMRUN_URL ?? "http://localhost:8000";
const API = [
  "/me",
  "/runs",
  "/events",
  "/servers",
  "/validate",
  "/estimate",
  "/snapshots",
  "/cleanup",
  "/usage",
  "/compare",
  "/local",
  "/task-types",
  "/workflow-yaml",
  "/edits",
];

export default defineConfig(({ command }) => ({
  // Relative in the build: the app works at /ui/ and at /<prefix>/ui/ behind a proxy.
  base: command === "build" ? "./" : "/ui/",
  plugins: [vue()],
  build: {
    outDir: "../simrun_api/ui",
    emptyOutDir: true,
    assetsDir: "assets",
    sourcemap: false,
    // One script and one style sheet: nothing to gain from chunks in an app of this size.
    modulePreload: false,
    chunkSizeWarningLimit: 400,
  },
  server: {
    proxy: Object.fromEntries(API.map((path) => [path, { target: service, changeOrigin: true }])),
  },
}));
