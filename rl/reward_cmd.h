// An external reward program (`ertrain grpo --reward-cmd PROG`): PROG is started once through
// `/bin/sh -c PROG` and kept running; each completion goes to its stdin as one line of JSON
//   {"prompt": ..., "completion": ..., "answer": ..., "budget": B, "length": L}
// and PROG answers one line on its stdout: a finite number (one term, named "cmd") or a JSON object of
// named finite numbers (one term each). docs/cli.md, "External reward program", is the user's view.
//
// Errors are the library's: a negative status and one er_error line naming PROG and quoting the
// offending reply; nothing is printed and no signal reaches this process (PROG's stdin is a socket
// written with MSG_NOSIGNAL). After an error the replies may be out of step with the queries, so every
// later call fails too: the caller stops, or frees this and starts PROG again.
#ifndef RL_REWARD_CMD_H
#define RL_REWARD_CMD_H

#define REWARD_MAX_TERMS 8
#define REWARD_LINE_MAX (1u << 20) // longest reply line accepted, in bytes (the newline not counted)

typedef struct RewardCmd RewardCmd;

typedef struct {
    const char *prompt, *completion, *answer; // NULL is sent as JSON null
    int budget, length;                       // the budget stated in the prompt, completion tokens
} RewardQuery;

typedef struct {
    int n;                               // 1 .. REWARD_MAX_TERMS
    char name[REWARD_MAX_TERMS][32];     // in the order PROG wrote them; "cmd" for a bare number
    double value[REWARD_MAX_TERMS];      // finite
} RewardTerms;

// Starts PROG (in its own process group, stdin and stdout connected to this process, stderr inherited).
// Fails when it cannot be started or when it exits within a short grace period (a command not found);
// a later exit shows at the next score. timeout_s bounds each reply (see reward_cmd_score_many).
int reward_cmd_start(const char *prog, double timeout_s, RewardCmd **out);
// Scores one completion: reward_cmd_score_many with n = 1.
int reward_cmd_score(RewardCmd *r, const RewardQuery *q, RewardTerms *out);
// Scores n completions: writes the queries while it reads the replies (so a slow PROG works on one
// while the next ones wait in its stdin, and neither side blocks on a full pipe); out[i] answers q[i].
// Each reply must come within timeout_s of its query being written and the previous reply being read;
// a PROG that reads nothing for timeout_s fails the same way.
int reward_cmd_score_many(RewardCmd *r, const RewardQuery *q, int n, RewardTerms *out);
// Closes PROG's stdin, waits up to a second for it to exit, then sends SIGTERM to its process group,
// then SIGKILL; always reaps it. Safe on NULL.
void reward_cmd_free(RewardCmd *r);

#endif
