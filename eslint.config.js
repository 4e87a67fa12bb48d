// The web UI's JavaScript (src/hotspan/ui/static/js): browser ES modules, no build step.
// scripts/lint.sh runs eslint with this file; formatting is prettier's (.prettierrc.json).
import js from "@eslint/js";
import globals from "globals";

export default [
  {
    files: ["src/hotspan/ui/static/js/**/*.js"],
    ...js.configs.recommended,
    languageOptions: {
      ecmaVersion: 2022,
      sourceType: "module",
      globals: globals.browser,
    },
    linterOptions: {
      reportUnusedDisableDirectives: "error",
    },
    rules: {
      ...js.configs.recommended.rules,
      eqeqeq: ["error", "always", { null: "ignore" }],
      "no-unused-vars": ["error", { args: "after-used", argsIgnorePattern: "^_" }],
      "prefer-const": "error",
      "no-var": "error",
    },
  },
];
