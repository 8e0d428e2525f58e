// `sbx completion bash|zsh`: a shell completion script made from commander's command tree
// (subcommand names, their options and short forms, which take a value and their choices), so it
// never lists a command or flag sbx does not have. bash: a `complete -F` function over
// COMP_WORDS/COMP_CWORD (bash(1) "Programmable Completion"); zsh: a `#compdef` function with
// `_arguments` (zshcompsys(1)). Nothing here talks to the supervisor.
import type { Command, Option } from 'commander';

interface OptionSpec {
  flag: string;
  /** Its short form (-d), if any: offered too, and skipped with its value like the long one. */
  short: string | null;
  description: string;
  takesValue: boolean;
  choices: string[] | null;
  /** A value that names a file or directory (completed as paths). */
  path: boolean;
}

interface CommandSpec {
  name: string;
  description: string;
  options: OptionSpec[];
}

function optionSpec(o: Option): OptionSpec | null {
  if (o.hidden || !o.long) return null;
  const takesValue = o.required || o.optional;
  return {
    flag: o.long,
    short: o.short ?? null,
    description: o.description,
    takesValue,
    choices: o.argChoices ?? null,
    path: takesValue && /<(file|dir|path)/.test(o.flags),
  };
}

const HELP: OptionSpec = { flag: '--help', short: null, description: 'display help', takesValue: false, choices: null, path: false };

/** The tree as completion needs it: the top level (its options) and each subcommand. */
function specs(program: Command): { top: OptionSpec[]; commands: CommandSpec[] } {
  const top = [...program.options.map(optionSpec).filter((o): o is OptionSpec => o !== null), HELP];
  const commands = program.commands.map((c) => ({
    name: c.name(),
    description: c.description(),
    options: [...c.options.map(optionSpec).filter((o): o is OptionSpec => o !== null), HELP],
  }));
  return { top, commands };
}

const words = (list: string[]) => list.join(' ');

/** An option's spellings: the long flag, then the short one if any. */
const spellings = (o: OptionSpec): string[] => (o.short ? [o.flag, o.short] : [o.flag]);

/** The bash script: `source <(sbx completion bash)`; completes subcommands, their options, choices and paths. */
export function bashCompletion(program: Command): string {
  const { top, commands } = specs(program);
  const valued = [...new Set([...top, ...commands.flatMap((c) => c.options)].filter((o) => o.takesValue).flatMap(spellings))];
  const lines = [
    '# bash completion for sbx (sandbox-supervisor); made by `sbx completion bash`.',
    '# Install: source <(sbx completion bash)  in ~/.bashrc, or',
    '#          sbx completion bash > /etc/bash_completion.d/sbx',
    '_sbx() {',
    '  local cur="${COMP_WORDS[COMP_CWORD]}" prev="" cmd="" i',
    '  (( COMP_CWORD > 0 )) && prev="${COMP_WORDS[COMP_CWORD-1]}"',
    '  # --opt=value: bash splits at "=" (COMP_WORDBREAKS), so "=" is a word of its own.',
    '  if [[ $cur == = ]]; then cur=""; elif [[ $prev == = ]] && (( COMP_CWORD > 1 )); then prev="${COMP_WORDS[COMP_CWORD-2]}"; fi',
    '  COMPREPLY=()',
    '  for (( i = 1; i < COMP_CWORD; i++ )); do',
    '    case "${COMP_WORDS[i]}" in',
    "      # The command after --: its name, then its own words are files (bash's default, quoted as it quotes).",
    '      --) [[ -n $cmd ]] && { (( i + 1 == COMP_CWORD )) && COMPREPLY=($(compgen -c -- "$cur" | sort -u)); return 0; } ;;',
    `      ${valued.join('|')}) [[ \${COMP_WORDS[i+1]} == = ]] && (( i++ )); (( i++ )) ;;`,
    '      -*) ;;',
    '      *) [[ -z $cmd ]] && cmd="${COMP_WORDS[i]}" ;;',
    '    esac',
    '  done',
    '  local opts=""',
    '  case "$prev" in',
  ];
  // A value of an option: its choices, a path, or nothing to offer.
  const byValue = new Map<string, string>();
  for (const o of [...top, ...commands.flatMap((c) => c.options)]) {
    if (!o.takesValue) continue;
    // A path: nothing here, so bash's default completes it (-o default: quoted, spaces and all); other values: nothing at all.
    for (const flag of spellings(o))
      byValue.set(
        flag,
        o.choices
          ? `compopt +o default 2>/dev/null; COMPREPLY=($(compgen -W "${words(o.choices)}" -- "$cur")); return 0 ;;`
          : o.path
            ? 'return 0 ;;'
            : 'compopt +o default 2>/dev/null; return 0 ;;',
      );
  }
  for (const [flag, action] of byValue) lines.push(`    ${flag}) ${action}`);
  lines.push('  esac', '  case "$cmd" in', `    "") opts="${words(top.flatMap(spellings))}" ;;`);
  for (const c of commands) lines.push(`    ${c.name}) opts="${words(c.options.flatMap(spellings))}" ;;`);
  lines.push(
    '  esac',
    '  if [[ $cur == -* ]]; then',
    '    compopt +o default 2>/dev/null',
    '    COMPREPLY=($(compgen -W "$opts" -- "$cur"))',
    '  elif [[ -z $cmd ]]; then',
    '    compopt +o default 2>/dev/null',
    `    COMPREPLY=($(compgen -W "${words([...commands.map((c) => c.name), 'help'])}" -- "$cur"))`,
    '  elif [[ $cmd == completion ]]; then',
    '    COMPREPLY=($(compgen -W "bash zsh" -- "$cur"))',
    '  elif [[ $cmd != verify && $cmd != restore ]]; then',
    '    compopt +o default 2>/dev/null # only verify and restore take files',
    '  fi',
    '  return 0',
    '}',
    '# -o default: where _sbx offers nothing (a path), bash completes file names as it always does.',
    'complete -o default -F _sbx sbx',
    '',
  );
  return lines.join('\n');
}

/** zsh's `_arguments` text for one description: brackets, colons and quotes escaped. */
function zshDescription(text: string): string {
  return text
    .split(/[;(]/)[0]!
    .trim()
    .replace(/\\/g, '\\\\')
    .replace(/'/g, `'\\''`)
    .replace(/([[\]:])/g, '\\$1');
}

/** The zsh script: `source <(sbx completion zsh)` after compinit, or saved as _sbx on $fpath. */
export function zshCompletion(program: Command): string {
  const { top, commands } = specs(program);
  const optionArgs = (options: OptionSpec[]) =>
    options.flatMap((o) => {
      const value = !o.takesValue ? '' : o.choices ? `:value:(${o.choices.join(' ')})` : o.path ? ':path:_files' : ':value:';
      // -d and --detach exclude each other, as zsh's own completions write it.
      const exclusive = o.short ? `(${o.short} ${o.flag})` : '';
      return spellings(o).map((flag) => `'${exclusive}${flag}[${zshDescription(o.description)}]${value}'`);
    });
  const lines = [
    '#compdef sbx',
    '# zsh completion for sbx (sandbox-supervisor); made by `sbx completion zsh`.',
    '# Install: sbx completion zsh > "${fpath[1]}/_sbx" (then compinit), or',
    '#          source <(sbx completion zsh)  in ~/.zshrc after compinit',
    '_sbx() {',
    '  local -a commands',
    '  commands=(',
    ...commands.map((c) => `    '${c.name}:${zshDescription(c.description).replace(/\\:/g, ':')}'`),
    '  )',
    '  local cmd="" ci=0 i',
    '  for (( i = 2; i < CURRENT; i++ )); do',
    '    case "${words[i]}" in',
    '      --) [[ -n $cmd ]] && { shift i words; (( CURRENT -= i )); _normal; return; } ;;',
    `      ${[...new Set([...top, ...commands.flatMap((c) => c.options)].filter((o) => o.takesValue).flatMap(spellings))].join('|')}) (( i++ )) ;;`,
    '      -*) ;;',
    '      *) [[ -z $cmd ]] && { cmd="${words[i]}"; ci=$i; } ;;',
    '    esac',
    '  done',
    '  # The subcommand as words[1], as _arguments wants it.',
    '  (( ci > 1 )) && { shift $(( ci - 1 )) words; (( CURRENT -= ci - 1 )); }',
    '  case "$cmd" in',
    `    "") _arguments ${optionArgs(top).join(' ')} '1:command: _describe command commands' ;;`,
    ...commands.map(
      (c) => `    ${c.name}) _arguments ${optionArgs(c.options).join(' ')}${c.name === 'completion' ? " '1:shell:(bash zsh)'" : " '*:argument:_files'"} ;;`,
    ),
    '  esac',
    '}',
    'if [[ $zsh_eval_context[-1] == loadautofunc ]]; then _sbx "$@"; else compdef _sbx sbx; fi',
    '',
  ];
  return lines.join('\n');
}
