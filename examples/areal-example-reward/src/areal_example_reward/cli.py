"""``areal example-reward score``: try the reward on a completion before training with it."""

from __future__ import annotations

import json

import typer

from areal_example_reward.reward import DEFAULT_WORD_BUDGET, concise_answer

app = typer.Typer(
    help="The concise_answer reward of areal-example-reward.\n\n"
    "Example: [bold]areal example-reward score 'The answer is 42.' --answer 42[/bold]",
    no_args_is_help=True,
    rich_markup_mode="rich",
)


@app.command("score")
def score_command(
    completion: str = typer.Argument(..., help="The agent's final answer text."),
    answer: str = typer.Option(..., "--answer", help="The reference answer."),
    word_budget: int = typer.Option(
        DEFAULT_WORD_BUDGET, "--word-budget", min=1, help="Words allowed before the discount."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON for scripts."),
) -> None:
    """Score one completion with the concise_answer reward (what a run would record).

    Example: [bold]areal example-reward score 'It is 7' --answer 7 --json[/bold]
    """
    task = {"answer": answer, "word_budget": word_budget}
    reward = concise_answer(completion=completion, task=task)
    if as_json:
        typer.echo(json.dumps({"reward": reward, "words": len(completion.split())}))
    else:
        typer.echo(f"{reward:.3f}")
