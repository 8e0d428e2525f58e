// The linter (npm run lint, which npm test runs first): typescript-eslint with type information
// and only rules that catch bugs here: a promise nobody awaits, returns or marks `void`; a
// promise where a callback's result is ignored; an import, variable or argument never used; an
// empty block or catch with no comment saying why. Style is the formatter's (.prettierrc.json).
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
);
