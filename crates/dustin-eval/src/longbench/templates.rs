//! LongBench's per-task prompt templates and generation limits, copied verbatim from
//! THUDM/LongBench, `LongBench/config/dataset2prompt.json` and
//! `LongBench/config/dataset2maxlen.json` (commit 2e00731f8d0bff23dc4325161044d0ed8af94c1e,
//! 2025-01-15), for the English tasks whose metrics this crate implements. The seven tasks of the
//! shared data folder are narrativeqa, qasper, multifieldqa_en, gov_report, passage_retrieval_en,
//! trec and samsum.
//!
//! The templates are Python `str.format` strings with the placeholders `{context}` and
//! `{input}` (filled from the JSONL fields of the same names). They are kept byte for byte,
//! including the upstream typo "asconcisely" of narrativeqa. Note that the MiniLongBench files of
//! the shared folder were rendered with slightly different templates (their qasper prompt is the
//! hotpotqa one, their narrativeqa prompt says "as concisely"); their prompts are used as given.
//!
//! Generated from the two JSON files by a one-off script; do not edit by hand.

/// `(task, template, max_new_tokens)` for every supported task.
pub(crate) static TASKS: &[(&str, &str, usize)] = &[
    (
        "narrativeqa",
        "You are given a story, which can be either a novel or a movie script, and a question. Answer the question asconcisely as you can, using a single phrase if possible. Do not provide any explanation.\n\nStory: {context}\n\nNow, answer the question based on the story asconcisely as you can, using a single phrase if possible. Do not provide any explanation.\n\nQuestion: {input}\n\nAnswer:",
        128,
    ),
    (
        "qasper",
        "You are given a scientific article and a question. Answer the question as concisely as you can, using a single phrase or sentence if possible. If the question cannot be answered based on the information in the article, write \"unanswerable\". If the question is a yes/no question, answer \"yes\", \"no\", or \"unanswerable\". Do not provide any explanation.\n\nArticle: {context}\n\n Answer the question based on the above article as concisely as you can, using a single phrase or sentence if possible. If the question cannot be answered based on the information in the article, write \"unanswerable\". If the question is a yes/no question, answer \"yes\", \"no\", or \"unanswerable\". Do not provide any explanation.\n\nQuestion: {input}\n\nAnswer:",
        128,
    ),
    (
        "multifieldqa_en",
        "Read the following text and answer briefly.\n\n{context}\n\nNow, answer the following question based on the above text, only give me the answer and do not output any other words.\n\nQuestion: {input}\nAnswer:",
        64,
    ),
    (
        "hotpotqa",
        "Answer the question based on the given passages. Only give me the answer and do not output any other words.\n\nThe following are given passages.\n{context}\n\nAnswer the question based on the given passages. Only give me the answer and do not output any other words.\n\nQuestion: {input}\nAnswer:",
        32,
    ),
    (
        "2wikimqa",
        "Answer the question based on the given passages. Only give me the answer and do not output any other words.\n\nThe following are given passages.\n{context}\n\nAnswer the question based on the given passages. Only give me the answer and do not output any other words.\n\nQuestion: {input}\nAnswer:",
        32,
    ),
    (
        "musique",
        "Answer the question based on the given passages. Only give me the answer and do not output any other words.\n\nThe following are given passages.\n{context}\n\nAnswer the question based on the given passages. Only give me the answer and do not output any other words.\n\nQuestion: {input}\nAnswer:",
        32,
    ),
    (
        "gov_report",
        "You are given a report by a government agency. Write a one-page summary of the report.\n\nReport:\n{context}\n\nNow, write a one-page summary of the report.\n\nSummary:",
        512,
    ),
    (
        "qmsum",
        "You are given a meeting transcript and a query containing a question or instruction. Answer the query in one or more sentences.\n\nTranscript:\n{context}\n\nNow, answer the query based on the above meeting transcript in one or more sentences.\n\nQuery: {input}\nAnswer:",
        512,
    ),
    (
        "multi_news",
        "You are given several news passages. Write a one-page summary of all news. \n\nNews:\n{context}\n\nNow, write a one-page summary of all the news.\n\nSummary:",
        512,
    ),
    (
        "trec",
        "Please determine the type of the question below. Here are some examples of questions.\n\n{context}\n{input}",
        64,
    ),
    (
        "triviaqa",
        "Answer the question based on the given passage. Only give me the answer and do not output any other words. The following are some examples.\n\n{context}\n\n{input}",
        32,
    ),
    (
        "samsum",
        "Summarize the dialogue into a few short sentences. The following are some examples.\n\n{context}\n\n{input}",
        128,
    ),
    (
        "passage_count",
        "There are some paragraphs below sourced from Wikipedia. Some of them may be duplicates. Please carefully read these paragraphs and determine how many unique paragraphs there are after removing duplicates. In other words, how many non-repeating paragraphs are there in total?\n\n{context}\n\nPlease enter the final count of unique paragraphs after removing duplicates. The output format should only contain the number, such as 1, 2, 3, and so on.\n\nThe final answer is: ",
        32,
    ),
    (
        "passage_retrieval_en",
        "Here are 30 paragraphs from Wikipedia, along with an abstract. Please determine which paragraph the abstract is from.\n\n{context}\n\nThe following is an abstract.\n\n{input}\n\nPlease enter the number of the paragraph that the abstract is from. The answer format must be like \"Paragraph 1\", \"Paragraph 2\", etc.\n\nThe answer is: ",
        32,
    ),
    (
        "lcc",
        "Please complete the code given below. \n{context}Next line of code:\n",
        64,
    ),
    (
        "repobench-p",
        "Please complete the code given below. \n{context}{input}Next line of code:\n",
        64,
    ),
];
