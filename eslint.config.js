// The linter (npm run lint, which npm test runs first): typescript-eslint with type information
// and only rules that catch bugs here: a promise nobody awaits, returns or marks `void`; a
// promise where a callback's result is ignored; an import, variable or argument never used; an
// empty block or catch with no comment saying why; in the product, a spread into push() or Math.max
// and min (every item on the stack: RangeError past ~120,000, as a first checkpoint of 1,000,000 files hit).
// Style is the formatter's (.prettierrc.json).
import tseslint from 'typescript-eslint';

export default tseslint.config(
  { ignores: ['dist/**', 'node_modules/**', 'native-helpers/build/**', 'clients/**', 'bench-results/**', '**/*.js', '**/*.mjs', 'vitest.config.ts'] },
  {
    files: ['**/*.ts'],
    languageOptions: {
      parser: tseslint.parser,
      parserOptions: { project: ['./tsconfig.test.json'], tsconfigRootDir: import.meta.dirname },
    },
    plugins: { '@typescript-eslint': tseslint.plugin },
    linterOptions: { reportUnusedDisableDirectives: 'error' },
    rules: {
      '@typescript-eslint/no-floating-promises': 'error',
      '@typescript-eslint/no-misused-promises': ['error', { checksVoidReturn: false }],
      '@typescript-eslint/no-unused-vars': [
        'error',
        { args: 'after-used', argsIgnorePattern: '^_', varsIgnorePattern: '^_', caughtErrors: 'none', ignoreRestSiblings: true },
      ],
      'no-empty': ['error', { allowEmptyCatch: false }],
    },
  },
  {
    // The product (not tests or benches, whose lists are their own and small).
    files: ['supervisor/**/*.ts', 'core/**/*.ts', 'ipc/**/*.ts', 'cli/**/*.ts'],
    rules: {
      'no-restricted-syntax': [
        'error',
        {
          selector: "CallExpression[callee.property.name='push'] > SpreadElement",
          message: 'push(...list) puts every item on the stack (RangeError past ~120,000): push them in a loop',
        },
        {
          selector: "CallExpression[callee.object.name='Math'][callee.property.name=/^(max|min)$/] > SpreadElement",
          message: 'Math.max(...list) puts every item on the stack (RangeError past ~120,000): reduce instead',
        },
      ],
    },
  },
);
