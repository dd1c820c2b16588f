package main

import (
	"fmt"
	"strings"
)

// completion is the completion script for shell ("bash" or "zsh"), made
// from the flag table so that it knows every flag lockrun knows.
func completion(shell string) string {
	if shell == "zsh" {
		return zshCompletion()
	}
	return bashCompletion()
}

// flagWords are every spelling of every flag (-n, --nonblock, --nb, ...);
// valued are those that take a value.
func flagWords() (all, valued []string) {
	for _, f := range flags {
		var words []string
		if f.short != 0 {
			words = append(words, "-"+string(f.short))
		}
		for _, l := range f.long {
			words = append(words, "--"+l)
		}
		all = append(all, words...)
		if f.value != nil {
			valued = append(valued, words...)
		}
	}
	return all, valued
}

// bashScript is the bash completion; %s are the flags and those that
// take a value. The first word after the flags is NAME or a subcommand
// (not after --, nor followed by --). After NAME (with -l, after -- or
// -c) it completes a command, and that command's arguments with
// bash-completion's _command_offset if loaded.
const bashScript = `# bash completion for lockrun: source <(lockrun completion bash)
_lockrun() {
	local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]}
	local flags='%s'
	local valued=' %s '
	case $prev in
	--dsn | --config)
		COMPREPLY=($(compgen -f -- "$cur"))
		return ;;
	--log-format)
		COMPREPLY=($(compgen -W 'text json' -- "$cur"))
		return ;;
	esac
	if [[ $valued == *" $prev "* ]]; then
		return
	fi
	local i=1 name=0 set=0 escaped=0
	while [[ $i -lt $COMP_CWORD ]]; do
		local w=${COMP_WORDS[i]}
		if [[ $w == -l || $w == --lock || $w == --lock=* ]]; then
			set=1
		fi
		if [[ $set -eq 1 && ( $w == -- || $w == -c ) ]]; then
			name=$i # with -l no word is NAME: the command follows -- or -c
			break
		elif [[ $w == -- ]]; then
			name=$((i + 1)) escaped=1
			break
		elif [[ $valued == *" $w "* ]]; then
			i=$((i + 1))
		elif [[ $w != -* ]]; then
			name=$i
			break
		fi
		i=$((i + 1))
	done
	if [[ $name -eq 0 || $name -ge $COMP_CWORD ]]; then
		if [[ $cur == -* ]]; then
			COMPREPLY=($(compgen -W "$flags" -- "$cur"))
		elif [[ $name -eq 0 && $set -eq 0 ]]; then
			COMPREPLY=($(compgen -W 'status completion' -- "$cur"))
		fi
		return
	fi
	if [[ $escaped -eq 0 && ( $COMP_CWORD -eq $((name + 1)) || ${COMP_WORDS[name+1]} != -- ) ]]; then
		case ${COMP_WORDS[name]} in
		status)
			if [[ $cur == -* ]]; then
				COMPREPLY=($(compgen -W "$flags" -- "$cur"))
			fi
			return ;;
		completion)
			if [[ $COMP_CWORD -eq $((name + 1)) ]]; then
				COMPREPLY=($(compgen -W 'bash zsh' -- "$cur"))
			fi
			return ;;
		esac
	fi
	local first=$((name + 1))
	if [[ ${COMP_WORDS[first]} == -- || ${COMP_WORDS[first]} == -c ]]; then
		first=$((first + 1))
	fi
	if [[ $COMP_CWORD -eq $first ]]; then
		COMPREPLY=($(compgen -c -- "$cur"))
	elif [[ $COMP_CWORD -gt $first ]] && declare -F _command_offset >/dev/null; then
		_command_offset "$first"
	else
		COMPREPLY=($(compgen -f -- "$cur"))
	fi
}
complete -F _lockrun lockrun
`

func bashCompletion() string {
	all, valued := flagWords()
	return fmt.Sprintf(bashScript, strings.Join(all, " "), strings.Join(valued, " "))
}

// zshScript is the zsh completion; %s are _arguments' flag specs and the
// flags that take a value. It works from fpath (as _lockrun) and sourced
// after compinit.
const zshScript = `#compdef lockrun
# zsh completion for lockrun: lockrun completion zsh > "${fpath[1]}/_lockrun"
# (or, after compinit: source <(lockrun completion zsh))
_lockrun() {
	local -a flags
	flags=(
%s	)
	local valued=' %s '
	# i: the first word after the flags, NAME or a subcommand
	local i=2
	while (( i < CURRENT )) && [[ $words[i] == -* && $words[i] != -- ]]; do
		[[ $valued == *" $words[i] "* ]] && (( i++ ))
		(( i++ ))
	done
	if (( i == CURRENT )) && [[ $words[i] != -* ]]; then
		_alternative 'subcommands:subcommand:(status completion)' 'names:lock name:'
		return
	fi
	if (( i < CURRENT )) && { (( i + 1 == CURRENT )) || [[ $words[i+1] != -- ]]; }; then
		case $words[i] in
		completion)
			(( CURRENT == i + 1 )) && _values shell bash zsh
			return ;;
		status)
			_arguments -s $flags '*:lock name:'
			return ;;
		esac
	fi
	if (( ${words[(I)(-l|--lock|--lock=*)]} )); then
		# with -l no word is NAME: the command follows --
		_arguments -s -S $flags '*::command:_normal'
		return
	fi
	_arguments -s -S $flags '1:lock name:' '*::command:_lockrun_command'
}
# _lockrun_command completes what follows NAME: a command and its arguments.
_lockrun_command() {
	shift words
	(( CURRENT-- ))
	_normal
}
if [[ $funcstack[1] == _lockrun ]]; then
	_lockrun "$@"
else
	compdef _lockrun lockrun
fi
`

func zshCompletion() string {
	var specs strings.Builder
	for _, f := range flags {
		desc := strings.NewReplacer("[", "(", "]", ")", "'", "").Replace(f.help)
		arg := ""
		if f.value != nil {
			arg = ":" + f.long[0] + ":"
			if f.long[0] == "dsn" || f.long[0] == "config" {
				arg += "_files"
			}
			if f.long[0] == "log-format" {
				arg += "(text json)"
			}
		}
		for _, w := range zshNames(f) {
			fmt.Fprintf(&specs, "\t\t'%s[%s]%s'\n", w, desc, arg)
		}
	}
	_, valued := flagWords()
	return fmt.Sprintf(zshScript, specs.String(), strings.Join(valued, " "))
}

// zshNames spells f's names as _arguments wants them, a value flag's long
// names with a trailing = (for --wait=5 and --wait 5).
func zshNames(f flagSpec) []string {
	var out []string
	if f.short != 0 {
		out = append(out, "-"+string(f.short))
	}
	for _, l := range f.long {
		if f.value != nil {
			out = append(out, "--"+l+"=")
		} else {
			out = append(out, "--"+l)
		}
	}
	return out
}
