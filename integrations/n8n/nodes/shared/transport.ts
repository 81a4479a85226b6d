import type {
	IBinaryData,
	IDataObject,
	IExecuteFunctions,
	IHttpRequestMethods,
	IHttpRequestOptions,
	INodeExecutionData,
	JsonObject,
} from 'n8n-workflow';
import { NodeApiError, NodeOperationError } from 'n8n-workflow';

export const CREDENTIAL = 'werkApi';

/** The binary field a prefill's handoff travels in (never the item's JSON). */
export const HANDOFF_BINARY = 'werkHandoff';
export const HANDOFF_MIME = 'application/vnd.werk.handoff';
export const HANDOFF_PLACEHOLDER = '[in binary werkHandoff]';

/** What a Werk handoff looks like (werk_host/service/handoffs.py: "wh_" + token_urlsafe(32)). */
const HANDOFF_PATTERN = /wh_[A-Za-z0-9_-]{8,}/g;

/** Text with every handoff-looking token (and each given secret) replaced. */
export function redact(text: string, secrets: string[] = []): string {
	let out = text.replace(HANDOFF_PATTERN, '[redacted handoff]');
	for (const secret of secrets) {
		if (secret) out = out.split(secret).join('[redacted handoff]');
	}
	return out;
}

export interface WerkResponse {
	statusCode: number;
	body: unknown;
	headers: IDataObject;
}

export interface RequestSpec {
	method: IHttpRequestMethods;
	path: string;
	body?: IDataObject;
	qs?: IDataObject;
	/** Raw bytes (a job's result file) instead of JSON. */
	binary?: boolean;
	/** Secrets of this request, kept out of any error text. */
	secrets?: string[];
}

function isObject(value: unknown): value is IDataObject {
	return typeof value === 'object' && value !== null && !Array.isArray(value);
}

/**
 * The error of a failed answer: Werk's envelope (`{"protocol", "request_id", "error": {"code",
 * "message", "retryable", "details"?}}`) or OpenAI's (`{"error": {"message", "type", "param",
 * "code"}}`). Only the server's code and message are shown, never the request.
 */
export function describeError(
	statusCode: number,
	body: unknown,
): { code: string; message: string; requestId?: string; retryable?: boolean; type?: string } {
	let parsed = body;
	if (typeof body === 'string') {
		try {
			parsed = JSON.parse(body);
		} catch {
			parsed = undefined;
		}
	} else if (body instanceof Uint8Array) {
		try {
			parsed = JSON.parse(Buffer.from(body).toString('utf8'));
		} catch {
			parsed = undefined;
		}
	}
	if (isObject(parsed) && isObject(parsed.error)) {
		const error = parsed.error;
		const code = error.code ?? error.type ?? `http_${statusCode}`;
		return {
			code: String(code),
			message: typeof error.message === 'string' ? error.message : `HTTP ${statusCode}`,
			requestId: typeof parsed.request_id === 'string' ? parsed.request_id : undefined,
			retryable: typeof error.retryable === 'boolean' ? error.retryable : undefined,
			type: typeof error.type === 'string' ? error.type : undefined,
		};
	}
	return { code: `http_${statusCode}`, message: `Werk answered HTTP ${statusCode}` };
}

/** The NodeApiError for a failed answer, with a hint for the codes a user can act on. */
export function apiError(
	ctx: IExecuteFunctions,
	statusCode: number,
	body: unknown,
	secrets: string[] = [],
	itemIndex?: number,
): NodeApiError {
	const error = describeError(statusCode, body);
	const message = redact(error.message, secrets);
	let text = `Werk error ${error.code}: ${message}`;
	let description: string | undefined;
	if (error.code === 'expired_handoff') {
		text =
			'Werk error expired_handoff: the handoff was already used or has expired (a handoff is single use): run Werk Prefill again';
		description = message;
	} else if (error.code === 'unauthorized') {
		description = 'Check the API key of the Werk API credential';
	}
	if (error.requestId) {
		description = `${description ? description + '; ' : ''}request_id ${error.requestId}`;
	}
	const detail: JsonObject = { code: error.code, message };
	if (error.requestId) detail.request_id = error.requestId;
	if (error.retryable !== undefined) detail.retryable = error.retryable;
	return new NodeApiError(ctx.getNode(), detail, {
		message: text,
		description,
		httpCode: String(statusCode),
		itemIndex,
	});
}

export async function baseUrl(ctx: IExecuteFunctions): Promise<string> {
	const credentials = await ctx.getCredentials(CREDENTIAL);
	const url = String(credentials.baseUrl ?? '').trim() || 'http://127.0.0.1:11434';
	return url.replace(/\/+$/, '');
}

/**
 * One request to Werk through the credential. HTTP errors come back as a NodeApiError built
 * from the server's envelope only; a transport error keeps only its (redacted) message, never
 * the request options (which would carry a handoff).
 */
export async function werkRequest(
	ctx: IExecuteFunctions,
	spec: RequestSpec,
	itemIndex?: number,
): Promise<WerkResponse> {
	const options: IHttpRequestOptions = {
		method: spec.method,
		url: (await baseUrl(ctx)) + spec.path,
		returnFullResponse: true,
		ignoreHttpStatusErrors: true,
	};
	if (spec.qs) options.qs = spec.qs;
	if (spec.binary) {
		options.encoding = 'arraybuffer';
		options.json = false;
	} else {
		options.json = true;
		options.headers = { Accept: 'application/json' };
	}
	if (spec.body !== undefined) {
		options.body = spec.body;
		options.json = true;
	}
	let response: { statusCode: number; body: unknown; headers?: IDataObject };
	try {
		response = await ctx.helpers.httpRequestWithAuthentication.call(ctx, CREDENTIAL, options);
	} catch (error) {
		const reason = error instanceof Error ? error.message : String(error);
		throw new NodeOperationError(
			ctx.getNode(),
			`Werk request ${spec.method} ${spec.path} failed: ${redact(reason, spec.secrets)}`,
			{ itemIndex },
		);
	}
	if (response.statusCode < 200 || response.statusCode >= 300) {
		throw apiError(ctx, response.statusCode, response.body, spec.secrets, itemIndex);
	}
	return { statusCode: response.statusCode, body: response.body, headers: response.headers ?? {} };
}

/** `data` of a Werk envelope (`{"protocol", "request_id", "data"}`). */
export function envelopeData(response: WerkResponse): IDataObject {
	const body = response.body;
	if (isObject(body) && isObject(body.data)) return body.data;
	throw new Error('Werk answered without a data member');
}

/** A JSON parameter: an object, or a string holding one. */
export function jsonObjectParameter(
	ctx: IExecuteFunctions,
	value: unknown,
	name: string,
	itemIndex: number,
): IDataObject {
	if (value === undefined || value === null || value === '') return {};
	let parsed = value;
	if (typeof value === 'string') {
		try {
			parsed = JSON.parse(value);
		} catch {
			throw new NodeOperationError(ctx.getNode(), `${name} is not valid JSON`, { itemIndex });
		}
	}
	if (!isObject(parsed)) {
		throw new NodeOperationError(ctx.getNode(), `${name} must be a JSON object`, { itemIndex });
	}
	return parsed;
}

/** The item's binary fields without the handoff. */
export function binaryWithout(item: INodeExecutionData, name: string): Record<string, IBinaryData> {
	const out: Record<string, IBinaryData> = {};
	for (const [key, value] of Object.entries(item.binary ?? {})) {
		if (key !== name) out[key] = value;
	}
	return out;
}

/** A failed item for "continue on fail": only the error's (already redacted) message. */
export function failedItem(error: unknown, itemIndex: number, secrets: string[] = []): INodeExecutionData {
	const message = error instanceof Error ? error.message : String(error);
	return { json: { error: redact(message, secrets) }, pairedItem: { item: itemIndex } };
}

/** Any error of an item as a node error: Werk's own errors as they are, anything else wrapped. */
export function asNodeError(
	ctx: IExecuteFunctions,
	error: unknown,
	itemIndex: number,
): NodeApiError | NodeOperationError {
	if (error instanceof NodeApiError || error instanceof NodeOperationError) return error;
	const message = error instanceof Error ? error.message : String(error);
	return new NodeOperationError(ctx.getNode(), redact(message), { itemIndex });
}
